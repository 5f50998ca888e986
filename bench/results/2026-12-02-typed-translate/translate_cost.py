"""CPU time of one translation (the client's JSON parsed, translated to the chat request, then its engine
request built), on whichever tree `gateway` is imported from: the parity cases' tool turn for Messages and
its settings case for Responses; the best of 5 runs of 2,000, in microseconds of process time."""

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gateway.protocol.anthropic import MessagesRequest
from gateway.protocol.engine_requests import EngineTarget
from gateway.protocol.parsing import parse_body
from gateway.protocol.responses_api import ResponsesRequest

sys.path.insert(0, str(Path(__file__).parent))
import parity

TARGET = EngineTarget(model="w")
MESSAGES, (RESPONSES, HISTORY) = parity.MCASES[2], parity.RCASES[1]


def best(run: Callable[[], object]) -> float:
    times = []
    for _ in range(5):
        start = time.process_time()
        for _ in range(2000):
            run()
        times.append((time.process_time() - start) / 2000 * 1e6)
    return min(times)


def main() -> None:
    raw_m, raw_r = json.dumps(MESSAGES).encode(), json.dumps(RESPONSES).encode()
    parse_m = best(lambda: parse_body(raw_m, MessagesRequest, dotted=True))
    parse_r = best(lambda: parse_body(raw_r, ResponsesRequest))
    whole_m = best(lambda: parity.run_m(MESSAGES, MessagesRequest).to_engine(TARGET))
    whole_r = best(lambda: parity.run_r(RESPONSES, HISTORY).to_engine(TARGET))
    print(f"messages : parse {parse_m:.1f} us, parse+translate+engine {whole_m:.1f} us")
    print(f"responses: parse {parse_r:.1f} us, parse+translate+engine {whole_r:.1f} us")


if __name__ == "__main__":
    main()
