"""The chaos suite's attacker: run in a container of its own with one node agent's NATS credentials.

    python attacker.py PLAN.json         (ATTACK_NATS_URL, ATTACK_NATS_CA in the environment)

It knows nothing of ibpool but what the plan (tests/chaos/attack.py) gives it: crafted messages to
publish, round after round with fresh ids, on subjects its user may publish; requests its user may
not make (publish a grant, delete or read another service's durable, make or purge a stream); and
subjects to snoop on. It reports what the servers let it do as one line, `ATTACK-REPORT {json}`,
and never decides whether the attack worked: the scenario's invariants do, from what the system did.
Only the standard library and nats-py, as an attacker with a stolen password would have.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import sys
from typing import Any

import nats
from nats.aio.msg import Msg


def refused(subject: str, errors: list[str]) -> bool:
    """Whether the server said it refused `subject` (nats-py passes its error on in lower case)."""
    return any("permissions violation" in e.lower() and f'"{subject.lower()}"' in e.lower() for e in errors)


async def attack(plan: dict[str, Any], url: str, ca: str) -> dict[str, Any]:
    errors: list[str] = []

    async def on_error(e: Exception) -> None:
        errors.append(str(e))

    nc = await nats.connect(
        servers=url.split(","),
        tls=ssl.create_default_context(cafile=ca),
        inbox_prefix=plan["inbox_prefix"],
        name="attacker",
        error_cb=on_error,
        max_reconnect_attempts=-1,
        connect_timeout=5,
    )
    js = nc.jetstream()
    report: dict[str, Any] = {"published": [], "publish_failed": [], "refused": {}, "snooped": {}}

    # Listen where other users' replies and events go, for the whole attack.
    received: dict[str, int] = {}
    for subject in plan["snoop"]:
        received[subject] = 0

        async def count(m: Msg, subject: str = subject) -> None:
            received[subject] += 1

        await nc.subscribe(subject, cb=count)

    # The crafted messages, on subjects this user may publish, while the load runs (bounded in time too).
    deadline = asyncio.get_running_loop().time() + plan["deadline_s"]
    for r in range(plan["rounds"]):
        for p in plan["crafted"]:
            if asyncio.get_running_loop().time() > deadline:
                report["publish_failed"].append(f"out of time after {plan['deadline_s']} s")
                break
            body = json.loads(p["data"])
            body["id"] = f"{body['id']}-{r}"
            headers = {**p["headers"], "Nats-Msg-Id": body["id"], "ce-id": body["id"]}
            data = json.dumps(body).encode()
            try:
                if p["stored"]:
                    ack = await js.publish(p["subject"], data, headers=headers, timeout=10)
                    if ack.duplicate:  # not stored again: it would prove nothing
                        report["publish_failed"].append(f"{p['subject']}: {body['id']} taken as a duplicate")
                        continue
                else:
                    await nc.publish(p["subject"], data, headers=headers)
                report["published"].append({"id": body["id"], "subject": p["subject"], "stored": p["stored"]})
            except Exception as e:
                report["publish_failed"].append(f"{p['subject']}: {type(e).__name__}: {e}")
        await nc.flush()
        await asyncio.sleep(plan["pause_s"])

    # What this user may not do: each must go unanswered, and the server must say it was refused.
    for p in plan["forbidden"]:
        before = len(errors)
        try:
            reply = await nc.request(p["subject"], p["data"].encode(), timeout=2, headers=p.get("headers") or None)
            outcome = f"answered: {reply.data[:300].decode(errors='replace')}"
        except Exception as e:
            outcome = type(e).__name__
        await asyncio.sleep(0.3)
        violation = refused(p["subject"], errors[before:])
        report["refused"][p["what"]] = {"subject": p["subject"], "outcome": outcome, "violation": violation}

    await asyncio.sleep(plan["pause_s"])
    for subject, n in received.items():
        violation = refused(subject, errors)
        report["snooped"][subject] = {"received": n, "violation": violation}
    report["errors"] = errors[:40]
    await nc.close()
    return report


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        plan = json.load(f)
    report = asyncio.run(attack(plan, os.environ["ATTACK_NATS_URL"], os.environ["ATTACK_NATS_CA"]))
    print("ATTACK-REPORT " + json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
