"""`infer serve`: the engine config and server limits from the flags, then the server (or a headless node)."""

from __future__ import annotations

import argparse
import os
import sys

from infer.cli.flags import ENGINE_FLAGS, HTTP_FLAGS, lora_options
from infer.cli.nodes import headless_node, run_headless_node


def run(args: argparse.Namespace) -> int:
    """`infer serve`: the engine core and the API servers until a signal stops them (on a node other than 0, its
    tensor-parallel workers)."""
    from infer.engine.config import EngineConfig
    from infer.server.launch import serve
    from infer.server.limits import ServerLimits

    if args.api_server_count is not None and args.api_server_count < 1:
        raise ValueError(f"--api-server-count={args.api_server_count}: must be >= 1")
    limits = ServerLimits(**{name: getattr(args, name) for name in HTTP_FLAGS}, access=access_policy(args))
    config = EngineConfig(model=args.model, **{name: getattr(args, name) for name in ENGINE_FLAGS},
                          **lora_options(args))  # type: ignore[arg-type]
    if headless_node(config):
        return run_headless_node(config)
    show_sampling_defaults(config)
    return serve(config, args.host, args.port, args.served_model_name, args.log_level, args.api_server_count, limits)


def access_policy(args: argparse.Namespace):  # -> AccessPolicy (imported lazily: startup time)
    """Who may call `infer serve`; one warning when it listens beyond this machine without an API key."""
    from infer.server.access import AccessPolicy, is_loopback

    key = args.api_key if args.api_key is not None else os.environ.get("INFER_API_KEY") or None
    policy = AccessPolicy(key, tuple(args.allowed_origins), tuple(args.allowed_hosts), args.host)
    if key is None and not is_loopback(args.host):
        print(f"[infer] warning: --host {args.host} listens beyond this machine and no API key is set: anyone who "
              f"can reach port {args.port} can use the server (set --api-key or INFER_API_KEY)", file=sys.stderr,
              flush=True)
    return policy


def show_sampling_defaults(config) -> None:  # (EngineConfig) imported lazily: startup time
    """Print the sampling defaults the generation config gives requests; a bad file fails here, before loading."""
    from infer.loader.model_path import resolve_model_path
    from infer.loader.generation_config import generation_config_file, sampling_defaults

    path = resolve_model_path(config.model)
    defaults = sampling_defaults(config.generation_config, path)
    if defaults:
        shown = ", ".join(f"{k}={v}" for k, v in defaults.items())
        print(f"[infer] sampling defaults of requests that leave them out: {shown} (from "
              f"{generation_config_file(config.generation_config, path)}; --generation-config vllm ignores it)",
              file=sys.stderr, flush=True)
