"""`orch watch`'s decision for one job (recovery/next_action.py) as a table: a situation (manifest,
claims, the facts the controller would gather) -> the view it shows and the actions, in order. Pure:
no bucket, provider, store or clock. The facts a row does not give are asked for (`Plan.need`) and
answered here from the row's own tables, so each row also says which questions the decision asks."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import pytest

from orchestrator.objectstore import claims as cl
from orchestrator.objectstore import moves
from orchestrator.recovery import actions as ac
from orchestrator.recovery.next_action import next_action
from orchestrator.recovery.policy import Decision

NOW = 1_700_000_000.0
UID = "a" * 32
RULES = ac.Rules(
    stale_after_s=300.0,
    launch_timeout_s=1200.0,
    capacity_retry_s=30.0,
    poll_s=30.0,
    max_launches=3,
    changeover_s=600.0,
    provider="command",
)
OLD = {"host": "old", "home_id": "home-old", "heartbeat": NOW - 900, "instance_id": "vm-old"}  # lapsed
SPOT, OD, IDLE = Decision("spot", "spot can be had"), Decision("on-demand", "no spot"), Decision("idle", "waits")


def owner(age: float, home: str = "home-old", **more: Any) -> dict[str, Any]:
    return {"host": home.removeprefix("home-"), "home_id": home, "heartbeat": NOW - age, **more}


def manifest(own: Optional[dict[str, Any]] = None, state: str = "running", **more: Any) -> dict[str, Any]:
    return {"uid": UID, "name": "bert", "state": state, "owner": own or {}, "written_at": NOW - 2000, **more}


def claim(n: int, status: str, market: str = "spot", lost: Any = None, ago: float = 60.0, **extra: Any) -> cl.Claim:
    lost = OLD if lost is None else lost
    lost = {k: lost.get(k) for k in ("host", "home_id", "heartbeat")}
    launched = f"vm-{n}" if status == cl.LAUNCHED else ""
    extra.setdefault("instance_id", launched) if launched else None
    return cl.Claim(UID, n, status, market, lost, NOW - ago, "ctl-other", NOW - ago, launched=launched, extra=extra)


def move(status: str = moves.ASKED, to: str = "spot", home: str = "home-old") -> moves.MoveRequest:
    return moves.MoveRequest(UID, to, "on-demand", "spot is back", "ctl", NOW - 100, home, "vm-old", status)


def run(
    m: dict[str, Any],
    claims: list[cl.Claim],
    *,
    gone: Optional[dict[str, Any]] = None,  # instance or home -> answer
    decide: Decision = SPOT,
    under_way: Optional[moves.MoveRequest] = None,
    stops: Optional[dict[str, str]] = None,
    **facts: Any,
) -> tuple[ac.Plan, list[str]]:
    f = ac.Facts(UID, facts.pop("rules", RULES), **facts)
    asked = []
    for _ in range(10):
        plan = next_action(m, claims, f, NOW)
        need = plan.need
        if need is None:
            return plan, asked
        if isinstance(need, ac.NeedGone):
            who = str(need.machine.get("instance_id") or need.machine.get("home_id"))
            asked.append(f"gone?{who}")
            f = dataclasses.replace(f, gone={**f.gone, ac.machine_key(need.machine): (gone or {})[who]})
        elif isinstance(need, ac.NeedDecision):
            asked.append(f"policy?{need.current}:{need.losses}")
            f = dataclasses.replace(f, decisions={**f.decisions, (need.current, need.losses): decide})
        elif isinstance(need, ac.NeedMove):
            asked.append("move?")
            f = dataclasses.replace(f, move_read=True, move=under_way)
        elif isinstance(need, ac.NeedStop):
            asked.append(f"stop?{need.instance}")
            f = dataclasses.replace(f, stops={**f.stops, need.instance: (stops or {})[need.instance]})
    raise AssertionError("the decision kept asking")


def said(plan: ac.Plan) -> list[str]:
    """The actions, in short words."""
    out = []
    for a in plan.actions:
        if isinstance(a, ac.WriteClaim):
            out.append(f"write {a.claim.n} {a.why}")
        elif isinstance(a, ac.Report):
            out.append(f"report {a.kind.value}")
        elif isinstance(a, ac.Place):
            out.append(
                f"place {a.n} {a.market}" + (" reuse" if a.reuse else "") + (" move" if a.move or a.move_for else "")
            )
        elif isinstance(a, ac.Stop):
            out.append(f"stop {a.instance}")
        elif isinstance(a, ac.AdoptedEarly):
            out.append(f"adopted-early {a.n} {a.home}")
        elif isinstance(a, ac.SettleMove):
            out.append("settle-move" + (" close" if a.close else ""))
        elif isinstance(a, ac.MarkMove):
            out.append(f"mark-move {a.status}")
        elif isinstance(a, ac.AskMove):
            out.append(f"ask-move {a.to}")
        else:
            out.append(type(a).__name__.lower())
    return out


ROWS: list[tuple[str, dict[str, Any], list[cl.Claim], dict[str, Any], tuple[str, str, list[str], list[str]]]] = [
    # name, manifest, claims, facts -> (state, a word of its note, actions, questions asked)
    ("fresh lease alive", manifest(owner(10)), [], {}, ("alive", "lease held by old", ["noteholder"], ["move?"])),
    (
        "lease came back to life: the open claim is cancelled",
        manifest(owner(10)),
        [claim(1, cl.CLAIMED)],
        {},
        ("alive", "lease held", ["write 1 cancelled", "noteholder"], ["move?"]),
    ),
    (
        "adopted before the launch returned",
        manifest(owner(10, "home-new")),
        [claim(1, cl.CLAIMED)],
        {"in_flight": {1: NOW - 30}},
        ("alive", "lease held by new", ["adopted-early 1 home-new", "noteholder"], ["move?"]),
    ),
    (
        "adopted while its controller was gone: launched, reported",
        manifest(owner(10, "home-new")),
        [claim(1, cl.CLAIMED)],
        {},
        ("alive", "lease held", ["write 1 adopted", "report relaunched", "noteholder"], ["move?", "policy?spot:1"]),
    ),
    (
        "lapsed lease, provider says up",
        manifest(OLD),
        [],
        {"gone": {"vm-old": False}},
        ("alive", "says the machine is up", [], ["gone?vm-old"]),
    ),
    (
        "lapsed lease, provider asked",
        manifest(OLD),
        [],
        {"gone": {"vm-old": ac.ASKING}},
        ("alive", "asking the command provider", [], ["gone?vm-old"]),
    ),
    (
        "lapsed lease, provider says gone: lost, placed",
        manifest(OLD),
        [],
        {"gone": {"vm-old": True}},
        ("waiting", "", ["report machine_lost", "place 1 spot"], ["gone?vm-old", "policy?idle:1"]),
    ),
    (
        "lapsed lease, provider cannot tell: lost, placed",
        manifest(OLD),
        [],
        {"gone": {"vm-old": None}, "decide": OD},
        ("waiting", "", ["report machine_lost", "place 1 on-demand"], ["gone?vm-old", "policy?idle:1"]),
    ),
    (
        "never leased (orch launch): placed, nobody asked",
        manifest(),
        [],
        {},
        ("waiting", "", ["place 1 spot"], ["policy?idle:0"]),
    ),
    (
        "capacity wait on spot: free, the next poll",
        manifest(OLD),
        [claim(1, cl.NO_CAPACITY, ago=10)],
        {"decide": IDLE},
        ("waiting", "no spot capacity", ["wait"], ["policy?idle:1"]),
    ),
    (
        "capacity wait on on-demand backs off",
        manifest(OLD),
        [claim(1, cl.NO_CAPACITY, "on-demand", ago=100, capacity_tries=3)],
        {"decide": OD},
        ("waiting", "next try in 20 s", ["wait"], ["policy?idle:1"]),
    ),
    (
        "capacity wait, the other market goes at once (the claim reused)",
        manifest(OLD),
        [claim(1, cl.NO_CAPACITY, ago=10)],
        {"decide": OD},
        ("waiting", "", ["place 1 on-demand reuse"], ["policy?idle:1"]),
    ),
    (
        "capacity wait, another zone goes at once",
        manifest(OLD),
        [claim(1, cl.NO_CAPACITY, ago=10, zone="a")],
        {"decide": dataclasses.replace(SPOT, zone="b"), "rules": dataclasses.replace(RULES, zoned=True)},
        ("waiting", "", ["place 1 spot reuse"], ["policy?idle:1"]),
    ),
    (
        "launch in progress (its call runs)",
        manifest(OLD),
        [claim(1, cl.CLAIMED)],
        {"in_flight": {1: NOW - 30}},
        ("launching", "in progress since", [], []),
    ),
    (
        "launch claimed by another controller",
        manifest(OLD),
        [claim(1, cl.CLAIMED)],
        {},
        ("launching", "claimed by ctl-other", [], []),
    ),
    (
        "booting",
        manifest(OLD),
        [claim(1, cl.LAUNCHED)],
        {"gone": {"vm-1": False}},
        ("waiting", "is coming up: vm-1", [], ["gone?vm-1"]),
    ),
    (
        "gone while booting (once): marked, stopped, replaced at once",
        manifest(OLD),
        [claim(1, cl.LAUNCHED)],
        {"gone": {"vm-1": True}},
        ("waiting", "", ["write 1 gone while booting", "stop vm-1", "place 2 spot"], ["gone?vm-1", "policy?idle:2"]),
    ),
    (
        "gone while booting twice in a row: backoff",
        manifest(OLD),
        [claim(1, cl.LAUNCHED, gone_while_booting=NOW - 50), claim(2, cl.LAUNCHED, ago=20)],
        {"gone": {"vm-2": True}},
        (
            "waiting",
            "was gone while it booted; next try in 30 s",
            ["write 2 gone while booting", "stop vm-2", "wait"],
            ["gone?vm-2"],
        ),
    ),
    (
        "failed launch backs off",
        manifest(OLD),
        [claim(1, cl.FAILED, ago=10)],
        {},
        ("waiting", "launch 1 failed; next try in 20 s", ["wait"], []),
    ),
    (
        "max_launches: left alone",
        manifest(OLD),
        [claim(n, cl.FAILED, ago=5000) for n in (1, 2, 3)],
        {},
        ("left alone", "max_launches = 3", ["report relaunch_failed", "leavealone"], []),
    ),
    (
        "budget spent: left alone",
        manifest(OLD, budget={"max_cost": 1.0}, cost={"cost": 2.0}),
        [],
        {"gone": {"vm-old": True}},
        (
            "left alone",
            "spent 2.00 of its max_cost",
            ["report machine_lost", "report relaunch_failed", "leavealone"],
            ["gone?vm-old", "policy?idle:1"],
        ),
    ),
    (
        "released by a clean stop: not relaunched",
        manifest(owner(10, released=True)),
        [],
        {},
        ("released", "not relaunched", [], ["move?"]),
    ),
    (
        "handed over for a move, the new machine up: it takes the job",
        manifest(owner(10, released=True)),
        [claim(1, cl.LAUNCHED, move_for="home-old")],
        {"under_way": move(), "gone": {"vm-1": False}},
        ("waiting", "launch 1 takes it", ["mark-move launched"], ["move?", "gone?vm-1"]),
    ),
    (
        "handed over, no new machine: launched on the move's market",
        manifest(owner(10, released=True)),
        [],
        {"under_way": move(moves.HANDED_OVER)},
        ("waiting", "", ["place 1 spot move"], ["move?", "policy?idle:0"]),
    ),
    (
        "on on-demand, the policy wants spot: the new machine first",
        manifest(owner(10, instance_id="vm-1")),
        [claim(1, cl.LAUNCHED, "on-demand")],
        {},
        (
            "alive",
            "moving from on-demand to spot",
            ["noteholder", "place 2 spot move"],
            ["move?", "policy?on-demand:1"],
        ),
    ),
    (
        "a move's new machine claimed",
        manifest(owner(10, instance_id="vm-1")),
        [claim(1, cl.LAUNCHED, "on-demand"), claim(2, cl.CLAIMED, lost=owner(100), move_for="home-old")],
        {},
        ("alive", "launch 2 in progress", ["noteholder"], ["move?", "policy?on-demand:1"]),
    ),
    (
        "a move's new machine boots: reviewed when booted",
        manifest(owner(10, instance_id="vm-1")),
        [claim(1, cl.LAUNCHED, "on-demand"), claim(2, cl.LAUNCHED, lost=owner(100), move_for="home-old")],
        {"gone": {"vm-2": False}},
        ("alive", "launch 2 boots", ["noteholder", "review"], ["move?", "policy?on-demand:1", "gone?vm-2"]),
    ),
    (
        "a move's new machine booted: the holder is asked",
        manifest(owner(10, instance_id="vm-1")),
        [claim(1, cl.LAUNCHED, "on-demand"), claim(2, cl.LAUNCHED, lost=owner(800), ago=700, move_for="home-old")],
        {"gone": {"vm-2": False}},
        ("alive", "(launch 2 is up)", ["noteholder", "ask-move spot"], ["move?", "policy?on-demand:1", "gone?vm-2"]),
    ),
    (
        "a move no longer wanted: its new machine stopped",
        manifest(owner(10, instance_id="vm-1")),
        [claim(1, cl.LAUNCHED, "on-demand"), claim(2, cl.LAUNCHED, lost=owner(100), move_for="home-old")],
        {"decide": OD},
        ("alive", "lease held", ["noteholder", "stop vm-2"], ["move?", "policy?on-demand:1"]),
    ),
    (
        "a move settled: the old machine's stop under way, the move stays open",
        manifest(owner(10, "home-new", instance_id="vm-2")),
        [claim(1, cl.LAUNCHED, "on-demand"), claim(2, cl.LAUNCHED, lost=owner(100), move_for="home-old")],
        {"under_way": move(moves.LAUNCHED), "stops": {"vm-old": "stopping (try 1)"}},
        ("alive", "old machine vm-old: stopping (try 1)", ["noteholder", "settle-move"], ["move?", "stop?vm-old"]),
    ),
    (
        "a move settled and its old machine stopped: closed, the policy asked again",
        manifest(owner(10, "home-new", instance_id="vm-2")),
        [claim(1, cl.LAUNCHED, "on-demand"), claim(2, cl.LAUNCHED, lost=owner(100), move_for="home-old")],
        {"under_way": move(moves.LAUNCHED), "stops": {"vm-old": "stopped"}},
        ("alive", "vm-old: stopped", ["noteholder", "settle-move close"], ["move?", "stop?vm-old", "policy?spot:1"]),
    ),
    (
        "untrusted manifest: reported, never launched",
        manifest(OLD),
        [],
        {"untrusted": "it was not put in the bucket by `orch launch`", "content_id": "c1"},
        ("not trusted", "not launched", ["report untrusted"], []),
    ),
    (
        "untrusted and finished: nothing said",
        manifest(OLD, state="succeeded"),
        [],
        {"untrusted": "bad signature"},
        ("not trusted", "bad signature", [], []),
    ),
    ("finished job", manifest(OLD, state="succeeded"), [], {}, ("finished", "succeeded", ["settlefinished"], [])),
]


@pytest.mark.parametrize("name,m,claims,facts,expected", ROWS, ids=[r[0] for r in ROWS])
def test_next_action(name, m, claims, facts, expected):
    state, note, actions, asked = expected
    plan, questions = run(m, claims, **facts)
    assert plan.view is not None
    assert (plan.view.state, said(plan), questions) == (state, actions, asked), plan.view.note
    assert note in plan.view.note


def test_the_claims_given_are_not_changed():
    """The decision changes its own copies; the executor writes them."""
    claims = [claim(1, cl.CLAIMED)]
    plan, _ = run(manifest(owner(10)), claims)
    assert claims[0].status == cl.CLAIMED
    (write,) = plan.of(ac.WriteClaim)
    assert write.claim.status == cl.CANCELLED and write.claim.etag == claims[0].etag


def test_an_infeasible_deadline_is_reported_where_the_policy_says_so():
    late = Decision("on-demand", "the deadline cannot be met", infeasible_at=NOW + 7200, review_at=NOW + 60)
    plan, _ = run(manifest(OLD), [], gone={"vm-old": True}, decide=late)
    assert said(plan) == ["report machine_lost", "review", "report deadline_infeasible", "place 1 on-demand"]
    assert [a.at for a in plan.of(ac.Review)] == [NOW + 60]


def test_what_the_ledger_learns():
    plan, _ = run(manifest(owner(10, instance_id="vm-9")), [])
    assert plan.seen is not None and (plan.seen.finished, plan.seen.holder_home, plan.seen.holder_instance) == (
        False,
        "home-old",
        "vm-9",
    )
    released, _ = run(manifest(owner(10, released=True)), [])
    assert released.seen is None  # a released job decides nothing for its machines
