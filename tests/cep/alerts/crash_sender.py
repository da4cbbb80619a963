"""Child process for the crash test: enqueue matches, deliver, die by SIGKILL mid-delivery.

Usage: ``python crash_sender.py OUTBOX URL COUNT KILL_AT``; the secret comes from
``VIGIL_TEST_SECRET``. The process kills itself right after the response to message number
``KILL_AT`` (0-based) arrives, before the outbox records it as delivered.
"""

from __future__ import annotations

import os
import signal
import sys

from alerts_support import make_match

from cep.alerts import Dispatcher, Endpoint, HttpResponse, Message, Outbox


def main() -> None:
    path, url, count, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    endpoint = Endpoint("receiver", url, (os.environ["VIGIL_TEST_SECRET"],), timeout_s=5)
    victim = make_match(kill_at)["match_id"]

    def die_before_acknowledging(message: Message, response: HttpResponse) -> None:
        if message.msg_id == victim:
            os.kill(os.getpid(), signal.SIGKILL)

    with Outbox(path) as outbox:
        for i in range(count):
            outbox.enqueue(make_match(i), [endpoint])
        Dispatcher(outbox, [endpoint], on_response=die_before_acknowledging).drain(deadline_s=30)


if __name__ == "__main__":
    main()
