"""Real clients, unchanged, against a running `infer serve` (the bundled SmolLM2 by default): each check prints PASS
or FAIL with what it saw, and the script exits non-zero if any failed.

    .venv/bin/infer serve &                                         # the server, from the project's environment
    python -m venv /tmp/clients && /tmp/clients/bin/pip install openai-agents instructor langchain-openai
    /tmp/clients/bin/python benchmarks/client_checks.py --base-url http://127.0.0.1:8000/v1

Checks: the openai SDK's Responses API (plain, streamed, a function tool with its output fed back, previous_response_id),
embeddings (floats and base64), a request carrying `store: false` and `metadata`; the openai-agents SDK with a function
tool (tool_choice "required": the 135M model does not pick tools by itself); instructor's default TOOLS mode returning
a pydantic object at max_tokens=64; langchain-openai's bind_tools with a named tool, which must get exactly one call.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import struct
import sys
import traceback
from collections.abc import Callable

import openai
from pydantic import BaseModel

WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
RESULTS: list[tuple[str, bool, str]] = []


def check(name: str) -> Callable[[Callable[[], str]], Callable[[], str]]:
    def register(fn: Callable[[], str]) -> Callable[[], str]:
        try:
            RESULTS.append((name, True, fn()))
        except Exception as exc:  # a failed check is reported, the others still run
            RESULTS.append((name, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"))
        return fn
    return register


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="unused")
    model = client.models.list().data[0].id

    @check("responses: plain, streamed, previous_response_id")
    def _() -> str:
        first = client.responses.create(model=model, input="My name is Ada.", temperature=0, max_output_tokens=16)
        events = [e.type for e in client.responses.create(model=model, input="Hi", max_output_tokens=8, stream=True)]
        # 8 tokens may end the answer early: OpenAI then ends the stream with response.incomplete
        assert events[0] == "response.created" and events[-1] in ("response.completed", "response.incomplete"), events
        second = client.responses.create(model=model, input="What is my name?", previous_response_id=first.id,
                                         max_output_tokens=16, temperature=0)
        return f"{first.output_text!r} / {len(events)} events / {second.output_text!r}"

    @check("responses: a function tool and its output fed back")
    def _() -> str:
        first = client.responses.create(model=model, input="Weather in Paris?", tools=[WEATHER], tool_choice="required",
                                        max_output_tokens=64, temperature=0)
        call = next(item for item in first.output if item.type == "function_call")
        json.loads(call.arguments)
        second = client.responses.create(model=model, previous_response_id=first.id, tools=[WEATHER],
                                         input=[{"type": "function_call_output", "call_id": call.call_id,
                                                 "output": "sunny, 21 C"}], max_output_tokens=32, temperature=0)
        return f"{call.name}({call.arguments}) -> {second.output_text!r}"

    @check("embeddings: floats and base64")
    def _() -> str:
        floats = client.embeddings.create(model=model, input=["a cat", "a dog"])
        packed = client.embeddings.create(model=model, input="a cat", encoding_format="base64")  # left encoded when asked
        values = struct.unpack(f"<{len(floats.data[0].embedding)}f", base64.b64decode(packed.data[0].embedding))
        assert len(floats.data) == 2 and max(abs(a - b) for a, b in zip(values, floats.data[0].embedding)) < 1e-6
        return f"{len(floats.data[0].embedding)} dims, usage {floats.usage.prompt_tokens} tokens"

    @check("store: false and metadata are accepted")
    def _() -> str:
        reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=8,
                                               store=False, metadata={"team": "a"})
        return repr(reply.choices[0].message.content)

    @check("openai-agents: a function tool")
    def _() -> str:
        from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

        set_tracing_disabled(True)
        calls: list[str] = []

        @function_tool
        def get_weather(city: str) -> str:
            """Current weather in a city."""
            calls.append(city)
            return "sunny, 21 C"

        agent = Agent(name="weather", instructions="Answer with the weather tool.", tools=[get_weather],
                      model=OpenAIResponsesModel(model=model, openai_client=openai.AsyncOpenAI(base_url=args.base_url,
                                                                                                api_key="unused")),
                      model_settings=ModelSettings(tool_choice="required", max_tokens=64, temperature=0),
                      tool_use_behavior="stop_on_first_tool")
        result = asyncio.run(Runner.run(agent, "Weather in Paris?"))
        assert calls, "the tool was never called"
        return f"tool called with {calls}, final output {result.final_output!r}"

    @check("instructor TOOLS mode: a pydantic object at max_tokens=64")
    def _() -> str:
        import instructor

        class City(BaseModel):
            name: str
            country: str

        patched = instructor.from_openai(openai.OpenAI(base_url=args.base_url, api_key="unused"),
                                         mode=instructor.Mode.TOOLS)
        city = patched.chat.completions.create(model=model, response_model=City, max_tokens=64, max_retries=0,
                                               messages=[{"role": "user", "content": "Paris is in France."}])
        return repr(city)

    @check("langchain-openai: bind_tools with a named tool gets exactly one call")
    def _() -> str:
        from langchain_core.tools import tool
        from langchain_openai import ChatOpenAI

        @tool
        def get_weather(city: str) -> str:
            """Current weather in a city."""
            return "sunny"

        llm = ChatOpenAI(model=model, base_url=args.base_url, api_key="unused", max_tokens=64, temperature=0)
        message = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("Weather in Paris and in Rome?")
        assert len(message.tool_calls) == 1, message.tool_calls
        return repr(message.tool_calls)

    failed = 0
    for name, ok, detail in RESULTS:
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
