"""The protocol's published schema (docs/protocol.schema.json, `gpuq schema`) against the real gpuqd:
the document is a valid JSON Schema, and every command's request as the schema describes it is
answered with a reply the schema describes. Clients in other languages are built from it."""
import json
import os
import unittest

import jsonschema

from harness import REPO, DaemonTest, event_line, wait_until


def example_job():
    """A job that reports one progress event and one result, then ends."""
    events = "; ".join(event_line(**e) for e in ({"type": "progress", "epoch": 1, "loss": 0.5},
                                                 {"type": "result", "accuracy": 0.9}))
    return {"name": "reported", "shell": events, "gpus": 1}


class ProtocolSchema(DaemonTest):
    def setUp(self):
        super().setUp()
        self.schema = json.loads(self.d.ok("schema"))
        with open(os.path.join(REPO, "docs/protocol.schema.json")) as f:
            self.assertEqual(json.load(f), self.schema, "docs/protocol.schema.json is stale: gpuq schema > it")

    def validator(self, part):
        """A validator of `part` (a request or reply schema) that resolves $defs in the document."""
        return jsonschema.Draft202012Validator({**part, "$defs": self.schema["$defs"]})

    def undescribed(self, value, schema, path="", found=None):
        """The paths of the fields in `value` that `schema` does not describe (a record's field
        missing from its GPUQ_JSON_TYPE list would be sent but left out of the schema)."""
        found = [] if found is None else found
        while "$ref" in schema:
            schema = self.schema["$defs"][schema["$ref"].rsplit("/", 1)[1]]
        if isinstance(value, dict) and "properties" in schema:
            for k, v in value.items():
                if k not in schema["properties"]:
                    found.append(f"{path}/{k}")
                else:
                    self.undescribed(v, schema["properties"][k], f"{path}/{k}", found)
        elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
            for k, v in value.items():
                self.undescribed(v, schema["additionalProperties"], f"{path}/{k}", found)
        elif isinstance(value, list) and "items" in schema:
            for i, v in enumerate(value):
                self.undescribed(v, schema["items"], f"{path}/{i}", found)
        return found

    def exchange(self, request):
        """Sends `request` after checking the schema allows it; returns the reply body, checked
        against the command's reply schema."""
        command = self.schema["commands"][request["cmd"]]
        self.validator(command["request"]).validate(request)
        reply = self.d.request(request)
        self.assertIsNotNone(reply, request)
        self.assertTrue(reply.get("ok"), (request, reply))
        body = {k: v for k, v in reply.items() if k != "ok"}
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                  for e in self.validator(command["reply"]).iter_errors(body)]
        self.assertEqual(errors, [], f"{request['cmd']}'s reply is not what the schema says: {body}")
        self.assertEqual(self.undescribed(body, command["reply"]), [],
                         f"{request['cmd']}'s reply has fields its schema does not describe")
        return body

    def test_the_schema_is_valid_and_describes_every_reply(self):
        jsonschema.Draft202012Validator.check_schema(self.schema)
        start = self.exchange({"cmd": "watch", "timeout_s": 0})  # the cursor before any job
        ended = self.d.submit([example_job()])["ids"][0]
        self.d.wait([ended])
        # `held` waits for a job held for good, so released it stays queued, whatever the timing.
        anchor = self.d.submit([{"name": "anchor", "shell": "true"}], "--hold")["ids"][0]
        submitted = self.d.submit([{"name": "held", "shell": "true", "after": [anchor]}], "--hold")
        held, batch = submitted["ids"][0], submitted["batch"]
        gate, started = self.tmp_path("gate"), self.tmp_path("started")
        running = self.d.submit([{"name": "runs", "timeout_s": 120,  # bounded, should the test stop early
                                  "shell": f"touch {started}; while [ ! -e {gate} ]; do sleep 0.05; done"}])["ids"][0]
        started2 = self.tmp_path("started2")
        running2 = self.d.submit([{"name": "runs2", "timeout_s": 120,
                                   "shell": f"touch {started2}; while [ ! -e {gate} ]; do sleep 0.05; done"}])["ids"][0]
        wait_until(lambda: os.path.exists(started) and os.path.exists(started2), what="two jobs to run")
        sent, replies = set(), {}
        for request in (
                {"cmd": "hello", "protocol_version": self.schema["protocol_version"],
                 "protocol_minor": self.schema["protocol_minor"], "client": "test"},
                {"cmd": "status", "all": True},
                {"cmd": "status", "states": ["succeeded"], "name": "rep*", "limit": 5},
                {"cmd": "show", "id": ended},
                {"cmd": "results", "ids": [ended]},
                {"cmd": "wait", "ids": [ended], "timeout_s": 5},
                {"cmd": "events", "id": ended},
                {"cmd": "events", "id": ended, "type": "result"},
                {"cmd": "watch", "epoch": start["epoch"], "after": start["cursor"], "timeout_s": 0},
                {"cmd": "why", "id": held},
                {"cmd": "update", "ids": [held], "set": {"priority": 3}},
                {"cmd": "update", "batch": batch, "set": {"max_running": 2}},
                {"cmd": "release", "ids": [held]},
                {"cmd": "hold", "batch": batch},
                {"cmd": "cancel", "ids": [held]},
                {"cmd": "requeue", "ids": [running]},
                {"cmd": "preempt", "ids": [running2]},
                {"cmd": "gpus"},
                {"cmd": "drain", "gpus": [1], "reason": "schema test"},
                {"cmd": "undrain", "gpus": [1]},
                {"cmd": "usage"},
                {"cmd": "submit", "jobs": [{"name": "more", "shell": "true"}], "cwd": self.tmp, "hold": True,
                 "max_running": 1},
                {"cmd": "restart", "ids": [ended]},
                {"cmd": "clean", "ids": [held], "checkpoints_only": True},
                {"cmd": "shutdown"}):
            with self.subTest(cmd=request["cmd"]):
                body = self.exchange(request)
                replies.setdefault(request["cmd"], body)
            sent.add(request["cmd"])
        open(gate, "w").close()  # the requeued job's next attempt ends
        # What was checked held what a job reports, not only empty lists.
        self.assertEqual([e["type"] for e in replies["events"]["events"]], ["progress", "result"])
        self.assertEqual(replies["results"]["jobs"][0]["result"]["accuracy"], 0.9)
        self.assertEqual([j["id"] for j in replies["watch"]["jobs"]], [ended, anchor, held, running, running2])
        self.assertEqual(sent, set(self.schema["commands"]), "a command of the schema went untried")

    def test_labels_keep_their_type_for_clients_that_read_it_and_are_text_for_older_ones(self):
        job = self.d.submit([{"name": "typed", "shell": "true", "labels": {"lr": 0.3, "seed": 2, "tag": "a", "best": True}}],
                            "--hold")["ids"][0]

        def labels_seen(*hello):
            shown = self.d.requests([*hello, {"cmd": "show", "id": job}])[-1]
            self.assertEqual(shown["spec"]["labels"], shown["job"]["labels"])  # the spec's as the job's
            return shown["job"]["labels"]

        hello = {"cmd": "hello", "protocol_version": 1, "client": "test"}
        typed = {"lr": 0.3, "seed": 2, "tag": "a", "best": True}
        text = {"lr": "0.3", "seed": "2", "tag": "a", "best": "true"}
        self.assertEqual(labels_seen({**hello, "protocol_minor": 3}), typed)
        self.assertEqual(labels_seen({**hello, "protocol_minor": 2}), text)
        self.assertEqual(labels_seen(), text)  # no hello: minor 0
        self.assertEqual(json.loads(self.d.ok("show", str(job), "--json"))["job"]["labels"], typed)  # gpuq: minor 3

    def test_what_the_schema_refuses_gpuqd_refuses_by_name(self):
        """A request outside the schema's bounds is refused, naming the field the schema bounds."""
        for request, field in (({"cmd": "status", "limit": 2001}, "limit"),
                               ({"cmd": "show"}, "id"),
                               ({"cmd": "submit", "jobs": {"shell": "true"}, "cwd": "relative"}, "cwd"),
                               ({"cmd": "submit", "jobs": {"shell": "true"}, "cwd": "/tmp\u0000x"}, "cwd"),
                               ({"cmd": "update", "ids": [1], "batch": 0, "set": {"max_running": 2}},
                                "set.max_running"),
                               ({"cmd": "update", "ids": [1], "set": {"timeout_s": 0}}, "set.timeout_s"),
                               ({"cmd": "cancel", "ids": []}, "ids"),
                               ({"cmd": "update", "ids": [1], "set": {"max_running": 2}}, "set.max_running"),
                               ({"cmd": "clean", "ids": [1], "forget": True, "checkpoints_only": True}, "forget")):
            with self.subTest(request=request):
                schema = self.schema["commands"][request["cmd"]]["request"]
                self.assertFalse(self.validator(schema).is_valid(request))
                reply = self.d.request(request)
                self.assertFalse(reply["ok"], reply)
                self.assertIn(f"field `{field}`", reply["error"]["message"])


if __name__ == "__main__":
    unittest.main()
