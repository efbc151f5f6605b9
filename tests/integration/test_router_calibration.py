"""The router's calibration (router/calibration.py) against simulator engines with a known cost model: from its own
prefill legs it recovers what a computed token costs, and publishes the fit and its break-even on /ready, where
`duplex calibrate --router` reads it."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import uuid

import aiohttp

from duplex import calibrate_cli
from duplex_dev.chat import ChatClient, Conversation
from duplex_dev.launch.sim import async_sim_pair
from duplex_sidecars.router.app import Router, RouterServer
from duplex_sidecars.router.config import RouterConfig

US_PER_TOKEN = 500.0  # the simulated prefill's cost of a computed token
WORD = "report "


async def test_the_fit_recovers_the_simulated_cost_of_a_token():
    cost = ("--no-enable-prefix-caching", "--prefill-us-per-token", str(US_PER_TOKEN))
    async with async_sim_pair(prefill_args=cost) as (prefill, decode):
        config = RouterConfig.model_validate(
            {"prefill": [prefill.url], "decode": [decode.url], "reuse": {"calibration_min_samples": 8}}
        )
        server = RouterServer(Router(config))
        await server.start()
        try:
            async with ChatClient(server.url, model="sim") as client, aiohttp.ClientSession() as http:
                for i in range(12):  # turn 1 computes 100-1200 tokens, turn 2 reads them back
                    conv = Conversation(f"cal-{uuid.uuid4().hex}")
                    await client.turn(conv, WORD * (100 * (i + 1)))
                    await client.turn(conv, "and then?")
                async with http.get(server.url + "/ready") as resp:
                    fit = json.loads(await resp.read())["calibration"]
            # `duplex calibrate --router` reads the same fit (a blocking client: off the loop that serves it)
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                code = await asyncio.to_thread(calibrate_cli.main, ["--router", server.url, "--json"])
            assert code == 0 and json.loads(printed.getvalue()) == fit
        finally:
            await server.close()
    assert fit is not None and min(fit["recomputes"], fit["replays"]) >= 10  # a leg or two may be judged an outlier
    assert abs(fit["compute_seconds_per_token"] * 1e6 / US_PER_TOKEN - 1) < 0.3, fit
    # The simulated read costs next to nothing: reading pays from a few tokens on.
    assert fit["threshold"] is not None and 0 <= fit["threshold"] < 64, fit
