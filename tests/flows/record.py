"""Regenerate `basic.mitm`: `python -m tests.flows.record` records two turns (JSON and SSE) through
`ctproxy up --record` against the emulator. The file is small and committed for replay tests."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import openai

from tests.emulator import Emulator, Text
from tests.support.proxyproc import ProxyProcess

OUT = Path(__file__).with_name("basic.mitm")


async def main() -> None:
    OUT.unlink(missing_ok=True)
    async with Emulator() as emu:
        emu.script(Text("Paris is the capital of France.", deltas=3), Text("Streaming works.", deltas=3))
        with tempfile.TemporaryDirectory() as tmp:
            proxy = ProxyProcess(Path(tmp) / "state", upstream=emu.url, extra_args=["--record", str(OUT)])
            await proxy.astart()
            client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-example", max_retries=0)
            await client.responses.create(model="gpt-5", input="What is the capital of France?")
            stream = await client.responses.create(model="gpt-5", input="Say something, streaming.", stream=True,
                                                   tools=[{"type": "function", "name": "lookup",
                                                           "parameters": {"type": "object", "properties": {}}}])
            async for _ in stream:
                pass
            await client.close()
            await proxy.astop()
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    asyncio.run(main())
