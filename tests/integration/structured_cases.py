"""structured_cases.py — extraction schemas and documents for the structured-output tests
(tests/integration/structured_run.py, a fast subset in CI) and the full run
(bench/structured/run_e2e.py: 200 lines over the 20 schemas on SmolLM2 and Gemma 3).

Each case is (name, schema, document(i)): flat records, nested arrays of objects, enums,
unions with null, formats (date, email, uuid, ipv4, date-time, uri), integer bounds,
$defs with recursion. Documents are made from a seed so the lines are the same every run."""
import json
import random

FIRST = ["Ada", "Grace", "Alan", "Edsger", "Barbara", "Ken", "Donald", "Frances", "John", "Radia"]
LAST = ["Lovelace", "Hopper", "Turing", "Dijkstra", "Liskov", "Thompson", "Knuth", "Allen"]
CITY = ["Paris", "Lyon", "Berlin", "Madrid", "Oslo", "Rome", "Vienna", "Lisbon"]
ITEM = ["pencil", "notebook", "stapler", "lamp", "chair", "mug", "cable", "monitor"]


def _person(r):
    return "%s %s" % (r.choice(FIRST), r.choice(LAST))


def _obj(props, required=None, **kw):
    s = {"type": "object", "properties": props,
         "required": list(props) if required is None else required, "additionalProperties": False}
    s.update(kw)
    return s


S, I, N, B = {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}

CASES = [
    ("person", _obj({"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 150}}),
     lambda r: "%s is %d years old and lives in %s." % (_person(r), r.randint(18, 90),
                                                        r.choice(CITY))),
    ("contact", _obj({"name": S, "email": {"type": "string", "format": "email"},
                      "city": S}),
     lambda r: "Write to %s at %s@example.com; the office is in %s." % (
         _person(r), r.choice(LAST).lower(), r.choice(CITY))),
    ("sentiment", _obj({"sentiment": {"enum": ["positive", "negative", "neutral"]},
                        "confidence": {"type": "number", "minimum": 0, "maximum": 1}}),
     lambda r: r.choice(["I loved the %s, it works great.", "The %s broke after a day.",
                         "The %s arrived on Tuesday."]) % r.choice(ITEM)),
    ("order", _obj({"order_id": I, "items": {"type": "array", "minItems": 1, "maxItems": 4,
                                             "items": _obj({"item": S, "qty": {
                                                 "type": "integer", "minimum": 1,
                                                 "maximum": 99}})}}),
     lambda r: "Order %d: %d %ss and %d %ss." % (r.randint(1000, 9999), r.randint(1, 9),
                                                 r.choice(ITEM), r.randint(1, 9),
                                                 r.choice(ITEM))),
    ("event", _obj({"title": S, "date": {"type": "string", "format": "date"}, "city": S}),
     lambda r: "The %s meetup takes place in %s on 2025-%02d-%02d." % (
         r.choice(ITEM), r.choice(CITY), r.randint(1, 12), r.randint(1, 28))),
    ("invoice", _obj({"vendor": S, "total": {"type": "number", "minimum": 0},
                      "currency": {"enum": ["EUR", "USD", "GBP"]}, "paid": B}),
     lambda r: "%s Ltd billed %d.%02d %s; %s." % (
         r.choice(LAST), r.randint(10, 999), r.randint(0, 99), r.choice(["EUR", "USD", "GBP"]),
         r.choice(["already paid", "payment pending"]))),
    ("nullable", _obj({"name": S, "phone": {"type": ["string", "null"]},
                       "age": {"type": ["integer", "null"]}}),
     lambda r: "%s did not give a phone number." % _person(r)),
    ("tags", _obj({"tags": {"type": "array", "items": {"type": "string", "maxLength": 20},
                            "maxItems": 5}}),
     lambda r: "A post about %s, %s and %s." % (r.choice(ITEM), r.choice(CITY),
                                                r.choice(["travel", "tools", "food"]))),
    ("server", _obj({"host": S, "ip": {"type": "string", "format": "ipv4"},
                     "port": {"type": "integer", "minimum": 1, "maximum": 65535}}),
     lambda r: "Server %s listens on 10.%d.%d.%d port %d." % (
         r.choice(CITY).lower(), r.randint(0, 255), r.randint(0, 255), r.randint(1, 254),
         r.choice([22, 80, 443, 8080]))),
    ("ticket", _obj({"id": {"type": "string", "format": "uuid"},
                     "priority": {"enum": ["low", "medium", "high"]}, "summary": S}),
     lambda r: "Ticket %08x-1234-4abc-8def-%012x: %s is broken, %s priority." % (
         r.getrandbits(32), r.getrandbits(48), r.choice(ITEM),
         r.choice(["low", "medium", "high"]))),
    ("company", _obj({"name": S, "employees": {"type": "array", "maxItems": 3, "items": _obj(
        {"name": S, "role": {"enum": ["engineer", "manager", "sales"]}})}}),
     lambda r: "%s Corp employs %s (engineer) and %s (manager)." % (
         r.choice(LAST), _person(r), _person(r))),
    ("measurement", _obj({"value": N, "unit": {"enum": ["kg", "m", "s"]}}),
     lambda r: "The %s weighs %d.%d kg." % (r.choice(ITEM), r.randint(1, 20), r.randint(0, 9))),
    ("union", _obj({"result": {"anyOf": [_obj({"ok": {"const": True}, "value": I}),
                                         _obj({"ok": {"const": False}, "error": S})]}}),
     lambda r: r.choice(["The job returned %d." % r.randint(0, 99),
                         "The job failed: disk full."])),
    ("address", _obj({"street": S, "city": S, "zip": {"type": "string",
                                                      "pattern": "^[0-9]{5}$"}}),
     lambda r: "Ship to %d %s Street, %05d %s." % (r.randint(1, 99), r.choice(LAST),
                                                    r.randint(10000, 99999), r.choice(CITY))),
    ("timestamp", _obj({"what": S, "at": {"type": "string", "format": "date-time"}}),
     lambda r: "The backup finished at 2025-03-%02dT%02d:%02d:00Z." % (
         r.randint(1, 28), r.randint(0, 23), r.randint(0, 59))),
    ("link", _obj({"title": S, "url": {"type": "string", "format": "uri"}}),
     lambda r: "Read the %s guide at https://example.com/%s." % (r.choice(ITEM),
                                                                 r.choice(ITEM))),
    ("tree", {"$defs": {"node": _obj({"name": S, "children": {
        "type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/node"}}})},
              "$ref": "#/$defs/node"},
     lambda r: "%s has two subfolders, %s and %s." % (r.choice(CITY), r.choice(ITEM),
                                                      r.choice(ITEM))),
    ("flags", _obj({"urgent": B, "internal": B, "count": {"type": "integer", "minimum": 0,
                                                          "maximum": 10}}),
     lambda r: "An %s note about %d %ss." % (r.choice(["urgent internal", "ordinary"]),
                                              r.randint(0, 10), r.choice(ITEM))),
    ("optional", _obj({"name": S, "nickname": S, "age": I}, required=["name"]),
     lambda r: "Meet %s." % _person(r)),
    ("matrix", _obj({"rows": {"type": "array", "maxItems": 3, "items": {
        "type": "array", "maxItems": 3, "items": {"type": "integer"}}}}),
     lambda r: "The grid is %d %d / %d %d." % tuple(r.randint(0, 9) for _ in range(4))),
]


def line(cid, case, i, max_tokens=128, model="smollm2-135m", strict=True):
    """The input line of document i of case (name, schema, doc)."""
    name, schema, doc = case
    r = random.Random("%s-%d" % (name, i))
    text = doc(r)
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "max_tokens": max_tokens, "temperature": 0,
                     "messages": [{"role": "system", "content":
                                   "Extract the facts of the user's text as JSON with this "
                                   "schema: " + json.dumps(schema)},
                                  {"role": "user", "content": text}],
                     "response_format": {"type": "json_schema", "json_schema": {
                         "name": name, "strict": strict, "schema": schema}}}}


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.", "strict": True,
        "parameters": _obj({"city": S, "unit": {"enum": ["celsius", "fahrenheit"]}})}},
    {"type": "function", "function": {
        "name": "send_email", "description": "Send an email.", "strict": True,
        "parameters": _obj({"to": S, "subject": S})}},
]


def tool_line(cid, text, tool_choice="required", model="smollm2-135m", max_tokens=96):
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "max_tokens": max_tokens, "temperature": 0,
                     "messages": [{"role": "user", "content": text}], "tools": TOOLS,
                     "tool_choice": tool_choice}}
