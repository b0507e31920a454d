"""Probe scores over HTTP: the request fields' checks, `GET /v1/probes` and `POST /v1/probes/reload`.

A request's `probes` (true, or names), `probe_prompt` and `probe_stop` are checked against the loaded set
before anything is queued (400 naming the field). A reload asks the engine core to re-read the file the server
was started with (never a path from the request) and swap the weights in between two steps; a file that fails
validation leaves the loaded probes as they were and comes back as a 400.
"""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Request

from infer.sampling.params import SamplingParams
from infer.server.errors import APIError
from infer.server.openapi import ERROR_RESPONSES
from infer.server.state import ServerState
from infer.wire import check_probes

router = APIRouter()


def requested_probes(state: ServerState, params: SamplingParams) -> tuple[str, ...]:
    """The probe names each choice's scores carry; a 400 naming the field for a name or request not servable."""
    try:
        return check_probes(params, state.engine.probes)
    except ValueError as exc:
        field = str(exc).split(":", 1)[0]
        raise APIError(400, str(exc), field) from exc


def listing(state: ServerState) -> dict[str, object]:
    """The loaded probes without the host's file paths (the probe-set file, each probe's weights)."""
    probes = state.engine.probes
    return {"object": "list", "version": probes.version if probes else None,
            "data": [{k: v for k, v in asdict(info).items() if k != "source"} for info in (probes.probes if probes else ())]}


@router.get("/v1/probes")
async def list_probes(request: Request) -> dict[str, object]:
    """The loaded probes: name, layer, activation, content hash, set version."""
    return listing(request.app.state.infer)


@router.post("/v1/probes/reload", responses={400: ERROR_RESPONSES[400]})
async def reload_probes(request: Request) -> dict[str, object]:
    """Re-read the configured probe-set file and swap its weights in atomically between two steps."""
    state: ServerState = request.app.state.infer
    if (await request.body()).strip() not in (b"", b"{}"):
        raise APIError(400, "reload takes no parameters: it re-reads the probe-set file the server was started with",
                       "body", "unsupported_parameter")
    if state.built.config.probes is None:
        raise APIError(400, "probes: no probe set is loaded (start the server with --probes FILE)", "probes")
    try:
        state.engine.probes = await state.engine.call("reload_probes")
    except RuntimeError as exc:  # the core's ProbeError (or a file it cannot read), as text
        raise APIError(400, f"reload failed; the loaded probes are unchanged: {exc}", "probes") from exc
    return listing(state)
