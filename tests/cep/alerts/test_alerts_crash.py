"""A sender killed between a response and its acknowledgement re-sends after restart: the
receiver deduplicates it, and no alert is lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from alerts_support import SPEC_SECRET, make_match

from cep.alerts import DeliveryState, Dispatcher, Endpoint, Outbox, WebhookReceiver, status

HERE = Path(__file__).parent
REPO = HERE.parents[2]


def test_killed_after_response_before_ack_is_resent_and_deduplicated(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite"
    count, kill_at = 6, 2
    ids = [make_match(i)["match_id"] for i in range(count)]
    with WebhookReceiver(SPEC_SECRET) as receiver:
        env = {
            **os.environ,
            "VIGIL_TEST_SECRET": SPEC_SECRET,
            "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)]),
        }
        child = subprocess.run(
            [
                sys.executable,
                str(HERE / "crash_sender.py"),
                str(path),
                receiver.url,
                str(count),
                str(kill_at),
            ],
            env=env,
            capture_output=True,
            timeout=60,
        )
        assert child.returncode == -signal.SIGKILL, child.stderr.decode()
        # The receiver has the victim, but the dead sender never recorded its delivery.
        assert receiver.webhook_ids == ids[: kill_at + 1]
        with Outbox(path) as outbox:
            states = {m.msg_id: (m.state, m.attempts) for m in outbox.messages()}
            assert states[ids[kill_at]] == (DeliveryState.PENDING, 0)
            assert all(states[i] == (DeliveryState.DELIVERED, 1) for i in ids[:kill_at])
            assert status(outbox)["receiver"].pending == count - kill_at

            endpoint = Endpoint("receiver", receiver.url, (SPEC_SECRET,), timeout_s=5)
            result = Dispatcher(outbox, [endpoint]).drain(deadline_s=30)
            assert (result.delivered, result.pending) == (count - kill_at, 0)
            assert status(outbox)["receiver"].delivered == count

        assert receiver.webhook_ids == ids  # each exactly once, in order
        assert receiver.deliveries == count + 1
        assert receiver.duplicates == 1
