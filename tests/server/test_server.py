"""End-to-end tests of `kestrel serve` with clients this project did not write: OpenAI's official
Python client streams and completes chat and text from it and embeds texts with an embedding
model, raw HTTP sends what a client library would refuse to and reranks with a reranker, and the official Prometheus
client's OpenMetrics parser reads /metrics.

Run by `./build.sh test` (`server_tests`); `KESTREL_CLI` names the binary (default: the dev
build). The server runs on the CPU backend here (a software GPU adapter), which batches.
"""

import http.client
import json
import math
import signal
from concurrent.futures import ThreadPoolExecutor
import threading
import time
import unittest

import openai
import pydantic

from harness import API_KEY, PROMPT, ROOT, metrics, native_greedy, request, sample, start_server

EMBEDDING_MODEL = ROOT / "models/all-MiniLM-L6-v2.f32.gguf"
# llama.cpp's vectors (not normalized) and tokens of the reference texts for that model.
REFERENCE = json.loads((ROOT / "tests/data/embeddings/minilm.json").read_text())["cases"]
# The random-weight bert reranker and llama.cpp's scores of its query's documents, both written by
# kestrel-model's rerankers_match_llama_cpp (`./build.sh` copies them into models/).
RERANKER = ROOT / "models/synthetic-bert-pool4-f32.gguf"
RANKED = ROOT / "models/synthetic-bert-pool4-f32.gguf.rank.json"


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / (norm(a) * norm(b))


def norm(v):
    return math.sqrt(sum(x * x for x in v))


class ServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.process, cls.address = start_server(
            "--api-key", API_KEY, "--slots", "2", "--queue", "1", "--max-body-mb", "1", "--response-cache-mb", "1", "--cors-origin", "http://page.example")
        cls.client = openai.OpenAI(base_url=f"http://{cls.address}/v1", api_key=API_KEY, max_retries=0, timeout=300)

    @classmethod
    def tearDownClass(cls):
        cls.process.send_signal(signal.SIGTERM)
        cls.process.wait(timeout=60)
        cls.process.stderr.close()
        cls.client.close()

    def test_the_openai_client_streams_what_the_cli_generates(self):
        expected = native_greedy(PROMPT, 6)
        chunks = list(self.client.completions.create(
            model="any", prompt=PROMPT, max_tokens=6, temperature=0, stream=True, stream_options={"include_usage": True},
            extra_headers={"Cache-Control": "no-store"},
        ))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        self.assertEqual(text, expected["text"])
        self.assertEqual(chunks[-2].choices[0].finish_reason, expected["finish_reason"])
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, len(expected["token_ids"]))
        self.assertEqual(chunks[-1].usage.prompt_tokens, len(expected["prompt_token_ids"]))
        self.assertEqual(chunks[-2].model_extra["kestrel"]["token_ids"], expected["token_ids"])
        streamed_ids = [c.choices[0].model_extra["token_id"] for c in chunks[:-2]]
        self.assertTrue(set(streamed_ids) <= set(expected["token_ids"]), streamed_ids)

        whole = self.client.completions.create(model="any", prompt=PROMPT, max_tokens=6, temperature=0, extra_headers={"Cache-Control": "no-store"})
        self.assertEqual(whole.choices[0].text, expected["text"])
        self.assertEqual(whole.model_extra["kestrel"]["token_ids"], expected["token_ids"])
        self.assertEqual(whole.usage.total_tokens, len(expected["prompt_token_ids"]) + len(expected["token_ids"]))

    def test_chat_streams_as_openai_sends_it(self):
        messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a colour."}]
        stream = self.client.chat.completions.create(model="any", messages=messages, max_tokens=5, temperature=0, stream=True)
        chunks = list(stream)
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        self.assertTrue(all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks))
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        self.assertIn(chunks[-1].choices[0].finish_reason, ("stop", "length"))
        whole = self.client.chat.completions.create(model="any", messages=messages, max_tokens=5, temperature=0, extra_headers={"Cache-Control": "no-store"})
        self.assertEqual(whole.choices[0].message.content, text)
        self.assertEqual(whole.choices[0].message.role, "assistant")
        self.assertEqual(self.client.models.list().data[0].id, "SmolLM2-135M-Instruct.Q4_1")

    def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(self):
        def refused(status, code, call):
            with self.assertRaises(openai.APIStatusError) as caught:
                call()
            self.assertEqual(caught.exception.status_code, status)
            self.assertEqual(caught.exception.code, code, caught.exception.body)
            return caught.exception

        create = self.client.chat.completions.create
        refused(400, "invalid_option", lambda: create(model="m", messages=[{"role": "user", "content": "x"}], n=2))
        refused(400, "invalid_option", lambda: create(model="m", messages=[{"role": "wizard", "content": "x"}]))
        e = refused(400, "invalid_option", lambda: create(model="m", messages=[{"role": "user", "content": "x"}], temperature=-1))
        self.assertEqual(e.param, "temperature")
        refused(400, "invalid_option", lambda: create(model="m", messages=[{"role": "user", "content": "x"}], tools=[{"type": "function", "function": {"name": "two words"}}]))
        refused(400, "context_length_exceeded", lambda: self.client.completions.create(model="m", prompt="word " * 600, max_tokens=1))
        bad_key = openai.OpenAI(base_url=f"http://{self.address}/v1", api_key="wrong", max_retries=0)
        refused(401, "invalid_api_key", lambda: bad_key.models.list())

        for body, status, code in [
            ("{not json", 400, "invalid_json"),
            ("[1, 2]", 400, "invalid_json"),
            ({"prompt": 5}, 400, "invalid_option"),
            ({"prompt": "x", "stream": "yes"}, 400, "invalid_option"),
            ({"prompt": "x", "max_tokens": "many"}, 400, "invalid_option"),
            ("x" * (2 << 20), 413, "request_too_large"),
        ]:
            got, _, error = request(self.address, "POST", "/v1/completions", body, {"Content-Type": "application/json"})
            self.assertEqual((got, error["error"]["code"]), (status, code), error)
            self.assertEqual(error["error"]["type"], "invalid_request_error")
        self.assertEqual(request(self.address, "GET", "/v1/models", key=None)[0], 401)
        self.assertEqual(request(self.address, "GET", "/health", key=None)[0], 200, "/health is open for probes")
        status, _, error = request(self.address, "GET", "/v2/nothing")
        self.assertEqual((status, error["error"]["code"]), (404, "not_found"))
        status, _, error = request(self.address, "GET", "/v1/completions")
        self.assertEqual((status, error["error"]["code"]), (405, "method_not_allowed"))
        # Still serving.
        ok = self.client.completions.create(model="m", prompt=PROMPT, max_tokens=2, temperature=0, extra_headers={"Cache-Control": "no-store"})
        self.assertEqual(ok.usage.completion_tokens, 2)

    def test_a_panic_in_the_engine_fails_its_request_and_the_server_keeps_serving(self):
        # The dev-profile binary's test hook (kestrel-server's `test-hooks`, engine::PANIC_PROMPT):
        # the engine thread panics at this prompt's first token, inside a step.
        panic_prompt = "kestrel test hook: panic in the engine thread"
        expected = native_greedy(PROMPT, 4)
        for _ in range(2):
            with self.assertRaises(openai.InternalServerError) as caught:
                self.client.completions.create(model="m", prompt=panic_prompt, max_tokens=4, temperature=0, extra_headers={"Cache-Control": "no-store"})
            self.assertEqual(caught.exception.status_code, 500)
            self.assertEqual(caught.exception.code, "internal", caught.exception.body)
            self.assertIn("the test hook's panic", caught.exception.message)
            # The next request is answered as before, with the slot the panicking one held freed.
            ok = self.client.completions.create(model="m", prompt=PROMPT, max_tokens=4, temperature=0, extra_headers={"Cache-Control": "no-store"})
            self.assertEqual(ok.choices[0].text, expected["text"])
        self.assertEqual(request(self.address, "GET", "/health", key=None)[0], 200)
        self.assertEqual(sample(metrics(self.address), "kestrel_slots_in_use"), 0)

    def test_options_outside_openais_ranges_are_refused_naming_the_option_and_its_range(self):
        messages = [{"role": "user", "content": "x"}]
        no_store = {"Cache-Control": "no-store"}

        def refused(param, words, **options):
            with self.assertRaises(openai.BadRequestError) as caught:
                self.client.chat.completions.create(model="m", messages=messages, extra_headers=no_store, **options)
            e = caught.exception
            self.assertEqual((e.code, e.param), ("invalid_option", param), e.body)
            self.assertIn(param, e.message)
            self.assertIn(words, e.message)

        refused("temperature", "must be a number from 0 to 2, got 2.5", temperature=2.5)
        refused("top_p", "must be a number from 0 to 1, got 1.5", top_p=1.5)
        refused("presence_penalty", "must be a number from -2 to 2, got 2.5", presence_penalty=2.5)
        refused("frequency_penalty", "must be a number from -2 to 2, got -3", frequency_penalty=-3)
        refused("logit_bias", "must be a number from -100 to 100", logit_bias={"5": 101})
        refused("max_tokens", "must be an integer of at least 1, got -5", max_tokens=-5)
        refused("max_completion_tokens", "must be an integer of at least 1, got 0", max_completion_tokens=0)
        refused("top_logprobs", "must be an integer from 0 to 20, got 50", logprobs=True, top_logprobs=50)
        refused("n", "must be 1", n=2)
        # Just inside every range: answered.
        ok = self.client.chat.completions.create(
            model="m", messages=messages, max_tokens=1, temperature=2, top_p=0, presence_penalty=-2, frequency_penalty=2,
            logit_bias={"5": -100}, logprobs=True, top_logprobs=20, seed=0, extra_headers=no_store)
        self.assertEqual(len(ok.choices[0].logprobs.content[0].top_logprobs), 20)

        # What OpenAI's client refuses to send (NaN: "Out of range float values are not JSON
        # compliant"), or types it would not send, as raw JSON.
        for body, param, words in [
            ({"top_k": -1}, "top_k", "must be an integer of at least 0, got -1"),
            ({"seed": 1.5}, "seed", "must be an integer of at least 0, got 1.5"),
            ({"max_tokens": "many"}, "max_tokens", 'must be an integer of at least 1, got "many"'),
            # Too large for the engine's f32: infinity, in no range.
            ({"temperature": 1e39}, "temperature", "must be a number from 0 to 2, got inf"),
            ({"logprobs": 50}, "logprobs", "must be an integer from 0 to 20, got 50"),
        ]:
            status, _, error = request(self.address, "POST", "/v1/completions", {"prompt": "x", **body}, no_store)
            self.assertEqual((status, error["error"]["code"], error["error"]["param"]), (400, "invalid_option", param), error)
            self.assertIn(words, error["error"]["message"])
        for literal in ["NaN", "Infinity", "-Infinity"]:
            body = '{"prompt": "x", "temperature": %s}' % literal
            status, _, error = request(self.address, "POST", "/v1/completions", body, {"Content-Type": "application/json", **no_store})
            self.assertEqual((status, error["error"]["code"]), (400, "invalid_json"), error)

    def test_logprobs_come_where_openai_puts_them_whole_and_streamed(self):
        messages = [{"role": "user", "content": "Name a colour."}]
        options = dict(model="m", messages=messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3)

        def check(entries, text):
            self.assertEqual("".join(e.token for e in entries), text)
            for e in entries:
                self.assertLessEqual(e.logprob, 0)
                self.assertEqual(e.bytes, list(e.token.encode()))
                alternatives = [t.logprob for t in e.top_logprobs]
                self.assertEqual(len(alternatives), 3)
                self.assertEqual(alternatives, sorted(alternatives, reverse=True))
                # Greedy: the chosen token is the likeliest.
                self.assertEqual((e.top_logprobs[0].token, e.top_logprobs[0].logprob), (e.token, e.logprob))
            return [e.token for e in entries]

        whole = self.client.chat.completions.create(**options, extra_headers={"Cache-Control": "no-store"})
        content = whole.choices[0].logprobs.content
        self.assertEqual(len(content), whole.usage.completion_tokens)
        tokens = check(content, whole.choices[0].message.content)
        # Kestrel's own form keeps the token ids.
        self.assertEqual([step["token_id"] for step in whole.model_extra["kestrel"]["logprobs"]], whole.model_extra["kestrel"]["token_ids"])

        # Streamed, by the model (each chunk carries its token's) and from the response cache (the
        # stored answer in one chunk, its tokens' logprobs on the final chunk).
        for headers, cache in [({"Cache-Control": "no-store"}, None), ({}, "miss"), ({}, "hit")]:
            response = self.client.chat.completions.with_raw_response.create(**options, stream=True, extra_headers=headers)
            self.assertEqual(response.headers.get("x-kestrel-response-cache"), cache)
            chunks = list(response.parse())
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
            self.assertEqual(check(entries, text), tokens, cache)
            if cache is None:
                with_token = [c for c in chunks if c.choices and c.choices[0].model_extra.get("token_id") is not None]
                self.assertTrue(all(len(c.choices[0].logprobs.content) == 1 for c in with_token))

        # Text completions: OpenAI's legacy shape, for `logprobs` given as a count.
        text = self.client.completions.create(model="m", prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2, extra_headers={"Cache-Control": "no-store"})
        logprobs = text.choices[0].logprobs
        self.assertEqual("".join(logprobs.tokens), text.choices[0].text)
        self.assertEqual(len(logprobs.token_logprobs), len(logprobs.tokens))
        self.assertEqual(logprobs.text_offset, [len("".join(logprobs.tokens[:i])) for i in range(len(logprobs.tokens))])
        for token, logprob, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
            self.assertEqual(len(top), 2)
            self.assertEqual(max(top.values()), logprob)
            self.assertEqual(top[token], logprob)

    def test_structured_output_parses_into_a_pydantic_model(self):
        class City(pydantic.BaseModel):
            name: str = pydantic.Field(max_length=20)
            population: int = pydantic.Field(ge=0, le=50_000_000)
            capital: bool

        messages = [{"role": "system", "content": "Answer in JSON."}, {"role": "user", "content": "Describe a city."}]
        no_store = {"Cache-Control": "no-store"}
        # The client turns the model into OpenAI's strict JSON Schema and parses the answer back.
        completion = self.client.chat.completions.parse(
            model="any", messages=messages, response_format=City, temperature=0, max_tokens=120, extra_headers=no_store)
        self.assertEqual(completion.choices[0].finish_reason, "stop")
        self.assertIsInstance(completion.choices[0].message.parsed, City)
        # Streamed, sampled: the chunks' text is valid too.
        schema = {"type": "json_schema", "json_schema": {"name": "City", "schema": City.model_json_schema(), "strict": True}}
        stream = self.client.chat.completions.create(
            model="any", messages=messages, response_format=schema, temperature=1, seed=5, max_tokens=120, stream=True, extra_headers=no_store)
        City.model_validate_json("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
        # Kestrel's own regex, as an extra field.
        phone = self.client.completions.create(
            model="any", prompt="Call me at", max_tokens=12, temperature=0, extra_body={"regex": " [0-9]{3}-[0-9]{4}"}, extra_headers=no_store)
        self.assertRegex(phone.choices[0].text, r"^ [0-9]{3}-[0-9]{4}$")
        with self.assertRaises(openai.BadRequestError) as caught:
            self.client.chat.completions.create(
                model="any", messages=messages, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}})
        self.assertEqual((caught.exception.code, caught.exception.param), ("invalid_option", "response_format"))

    def test_tool_calls_round_trip_whole_and_streamed(self):
        tools = [{"type": "function", "function": {
            "name": "get_weather", "description": "The current weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                           "required": ["city"], "additionalProperties": False}}}]
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]
        no_store = {"Cache-Control": "no-store"}
        whole = self.client.chat.completions.create(
            model="any", messages=messages, tools=tools, tool_choice="required", temperature=0, max_tokens=80, extra_headers=no_store)
        choice = whole.choices[0]
        self.assertEqual(choice.finish_reason, "tool_calls")
        self.assertIsNone(choice.message.content)
        call = choice.message.tool_calls[0]
        self.assertEqual((call.type, call.function.name), ("function", "get_weather"))
        self.assertIsInstance(json.loads(call.function.arguments)["city"], str)
        # Streamed, sampled: the client joins the deltas into the same shape.
        stream = self.client.chat.completions.create(
            model="any", messages=messages, tools=tools, tool_choice={"type": "function", "function": {"name": "get_weather"}},
            temperature=1, seed=3, max_tokens=80, stream=True, extra_headers=no_store)
        chunks = [c for c in stream if c.choices]
        self.assertEqual(chunks[-1].choices[0].finish_reason, "tool_calls")
        streamed = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
        self.assertEqual([d.function.name for d in streamed], ["get_weather"])
        json.loads(streamed[0].function.arguments)
        self.assertEqual("".join(c.choices[0].delta.content or "" for c in chunks), "", "a call is not streamed as content")
        # The round trip: the call, the tool's result, then an answer in text.
        messages += [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "{\"temperature\": 18}"}]
        answer = self.client.chat.completions.create(
            model="any", messages=messages, tools=tools, tool_choice="none", temperature=0, max_tokens=20, extra_headers=no_store)
        self.assertIn(answer.choices[0].finish_reason, ("stop", "length"))
        self.assertTrue(answer.choices[0].message.content)
        self.assertIsNone(answer.choices[0].message.tool_calls)
        with self.assertRaises(openai.BadRequestError) as caught:
            self.client.chat.completions.create(model="any", messages=messages, tools=tools, tool_choice={"type": "function", "function": {"name": "nope"}})
        self.assertEqual((caught.exception.code, caught.exception.param), ("invalid_option", "tool_choice"))

    def test_pages_of_the_allowed_origin_may_call_it_and_others_may_not(self):
        preflight = {"Origin": "http://page.example", "Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "authorization, content-type"}
        status, headers, _ = request(self.address, "OPTIONS", "/v1/chat/completions", headers=preflight, key=None)
        self.assertEqual(status, 200, "a preflight needs no API key")
        self.assertEqual(headers["Access-Control-Allow-Origin"], "http://page.example")
        self.assertIn("authorization", headers["Access-Control-Allow-Headers"].lower())
        _, headers, _ = request(self.address, "GET", "/v1/models", headers={"Origin": "http://page.example"})
        self.assertEqual(headers["Access-Control-Allow-Origin"], "http://page.example")
        _, headers, _ = request(self.address, "GET", "/v1/models", headers={"Origin": "http://elsewhere.example"})
        self.assertNotIn("Access-Control-Allow-Origin", headers)

    def test_deterministic_requests_are_answered_from_the_response_cache(self):
        before = metrics(self.address)
        body = {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}
        status, headers, first = request(self.address, "POST", "/v1/completions", body)
        self.assertEqual((status, headers["x-kestrel-response-cache"]), (200, "miss"))
        status, headers, second = request(self.address, "POST", "/v1/completions", {**body, "stop": None})
        self.assertEqual((status, headers["x-kestrel-response-cache"]), (200, "hit"))
        self.assertTrue(second["usage"]["response_cache_hit"])
        self.assertFalse(first["usage"]["response_cache_hit"])
        self.assertEqual(second["choices"][0]["text"], first["choices"][0]["text"])
        self.assertEqual(second["kestrel"]["token_ids"], first["kestrel"]["token_ids"])
        # Streamed from the cache: the same text.
        chunks = list(self.client.completions.create(model="m", stream=True, **body))
        self.assertEqual("".join(c.choices[0].text for c in chunks), first["choices"][0]["text"])
        # Asked not to be cached, or sampled from the clock: run by the model.
        _, headers, unstored = request(self.address, "POST", "/v1/completions", body, {"Cache-Control": "no-store"})
        self.assertNotIn("x-kestrel-response-cache", headers)
        self.assertEqual(unstored["kestrel"]["token_ids"], first["kestrel"]["token_ids"])
        _, headers, sampled = request(self.address, "POST", "/v1/completions", {**body, "temperature": 0.7})
        self.assertNotIn("x-kestrel-response-cache", headers)
        after = metrics(self.address)
        self.assertEqual(sample(after, "kestrel_response_cache_hits_total") - sample(before, "kestrel_response_cache_hits_total"), 2)
        generated = sample(after, "kestrel_generated_tokens_total") - sample(before, "kestrel_generated_tokens_total")
        runs = [first, unstored, sampled]
        self.assertEqual(generated, sum(r["usage"]["completion_tokens"] for r in runs), "only the three model runs generated tokens")

    def test_a_full_queue_gets_429_and_a_client_that_leaves_frees_its_slot(self):
        before = metrics(self.address)
        # Two long generations hold both slots; one request may wait; the next is refused.
        streams = []
        for _ in range(2):
            connection = http.client.HTTPConnection(self.address, timeout=120)
            connection.request("POST", "/v1/completions", json.dumps({"prompt": PROMPT, "max_tokens": 400, "ignore_eos": True, "stream": True}),
                               {"Authorization": f"Bearer {API_KEY}"})
            stream = connection.getresponse()
            self.assertEqual(stream.status, 200)
            self.assertTrue(stream.readline().startswith(b"data: "), "the long request is generating")
            streams.append(connection)
        long, other = streams
        queued = {}
        waiter = threading.Thread(target=lambda: queued.update(result=request(
            self.address, "POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "temperature": 0}, {"Cache-Control": "no-store"})))
        waiter.start()
        deadline = time.time() + 30
        while request(self.address, "GET", "/health")[2]["pending_requests"] < 3:
            self.assertLess(time.time(), deadline, "the second request never queued")
            time.sleep(0.05)
        status, headers, error = request(self.address, "POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 2})
        self.assertEqual((status, error["error"]["code"]), (429, "rate_limit_exceeded"))
        self.assertGreaterEqual(int(headers["Retry-After"]), 1)
        # A long request's client goes away: its generation stops before the next step and the
        # queued request takes its slot while the other long one still runs.
        started = time.time()
        long.close()
        waiter.join(timeout=120)
        status, _, done = queued["result"]
        self.assertEqual(status, 200, done)
        self.assertLess(time.time() - started, 60, "the abandoned request kept its slot")
        self.assertEqual(sample(metrics(self.address), "kestrel_slots_in_use"), 1, "the other long request still runs")
        other.close()
        deadline = time.time() + 30
        while request(self.address, "GET", "/health")[2]["pending_requests"] > 0:
            self.assertLess(time.time(), deadline, "the second abandoned request kept its slot")
            time.sleep(0.05)
        after = metrics(self.address)
        self.assertEqual(sample(after, "kestrel_requests_total", endpoint="completions", outcome="client_gone")
                         - sample(before, "kestrel_requests_total", endpoint="completions", outcome="client_gone"), 2)
        self.assertEqual(sample(after, "kestrel_requests_total", endpoint="completions", outcome="rate_limit_exceeded")
                         - sample(before, "kestrel_requests_total", endpoint="completions", outcome="rate_limit_exceeded"), 1)
        self.assertEqual(sample(after, "kestrel_slots_in_use"), 0)
        self.assertEqual(sample(after, "kestrel_queue_depth"), 0)
        self.assertEqual(request(self.address, "GET", "/health")[2]["pending_requests"], 0)

    def test_a_chat_model_refuses_embeddings_and_rerank(self):
        before = metrics(self.address)
        with self.assertRaises(openai.BadRequestError) as caught:
            self.client.embeddings.create(model="m", input=["Hello world"])
        self.assertEqual((caught.exception.code, caught.exception.param), ("invalid_option", "model"))
        self.assertIn("chat model", caught.exception.message)
        status, _, error = request(self.address, "POST", "/v1/rerank", {"query": "q", "documents": ["a"]})
        self.assertEqual((status, error["error"]["code"], error["error"]["param"]), (400, "invalid_option", "model"))
        self.assertIn("cannot rerank", error["error"]["message"])
        after = metrics(self.address)
        for endpoint in ("embeddings", "rerank"):
            self.assertEqual(sample(after, "kestrel_requests_total", endpoint=endpoint, outcome="invalid_option")
                             - sample(before, "kestrel_requests_total", endpoint=endpoint, outcome="invalid_option"), 1, endpoint)
        self.assertEqual(request(self.address, "GET", "/health")[2]["model_type"], "chat")

    def test_metrics_count_what_happened(self):
        before = metrics(self.address)
        result = self.client.completions.create(model="m", prompt=PROMPT, max_tokens=3, temperature=0, extra_headers={"Cache-Control": "no-store"})
        after = metrics(self.address)
        delta = lambda name, **labels: sample(after, name, **labels) - sample(before, name, **labels)
        self.assertEqual(delta("kestrel_requests_total", endpoint="completions", outcome=result.choices[0].finish_reason), 1)
        self.assertEqual(delta("kestrel_time_to_first_token_seconds_count"), 1)
        self.assertEqual(delta("kestrel_inter_token_latency_seconds_count"), result.usage.completion_tokens - 1)
        self.assertEqual(delta("kestrel_request_duration_seconds_count"), 1)
        self.assertEqual(delta("kestrel_queue_wait_seconds_count"), 1)
        self.assertEqual(delta("kestrel_prompt_tokens_total"), result.usage.prompt_tokens)
        self.assertEqual(delta("kestrel_generated_tokens_total"), result.usage.completion_tokens)
        # One step a token (the short prompt is one chunk), each alone in its batch.
        self.assertEqual(delta("kestrel_batch_size_count"), result.usage.completion_tokens)
        self.assertEqual(delta("kestrel_batch_size_sum"), result.usage.completion_tokens)
        self.assertGreater(sample(after, "kestrel_model_memory_bytes"), 10 << 20, "the model's weights and KV cache")
        if request(self.address, "GET", "/health")[2]["backend"] == "gpu":
            self.assertGreater(sample(after, "kestrel_gpu_memory_bytes"), 10 << 20, "the model's weights are on the GPU")
        # The slot it ran in holds the prompt and every generated token but the last; the other
        # slot holds what an earlier request left.
        self.assertGreaterEqual(sample(after, "kestrel_kv_cache_tokens"), result.usage.total_tokens - 1)
        self.assertLessEqual(sample(after, "kestrel_kv_cache_tokens"), 2 * 512)
        self.assertEqual(request(self.address, "GET", "/health")[2]["slots"], 2)


class EmbeddingServerTest(unittest.TestCase):
    """A server over an embedding model: OpenAI's embeddings endpoint gives llama.cpp's vectors,
    normalized; the generation endpoints say it is an embedding model."""

    @classmethod
    def setUpClass(cls):
        cls.process, cls.address = start_server("--model", str(EMBEDDING_MODEL), "--api-key", API_KEY, "--queue", "1")
        cls.client = openai.OpenAI(base_url=f"http://{cls.address}/v1", api_key=API_KEY, max_retries=0, timeout=300)

    @classmethod
    def tearDownClass(cls):
        cls.process.send_signal(signal.SIGTERM)
        cls.process.wait(timeout=60)
        cls.process.stderr.close()
        cls.client.close()

    def assert_reference_vectors(self, answer):
        self.assertEqual([d.index for d in answer.data], list(range(len(REFERENCE))))
        for d, case in zip(answer.data, REFERENCE):
            self.assertEqual(len(d.embedding), len(case["vector"]), case["text"])
            self.assertGreaterEqual(cosine(d.embedding, case["vector"]), 0.999, case["text"])
            self.assertAlmostEqual(norm(d.embedding), 1.0, places=5, msg=case["text"])

    def test_the_openai_client_gets_llama_cpp_vectors_as_base64_and_floats(self):
        texts = [case["text"] for case in REFERENCE]
        # The client asks for base64 unless told otherwise, and decodes it to floats itself.
        packed = self.client.embeddings.create(model="any", input=texts)
        self.assert_reference_vectors(packed)
        self.assertEqual(packed.model, "all-MiniLM-L6-v2.f32")
        self.assertEqual(packed.usage.prompt_tokens, sum(len(case["tokens"]) for case in REFERENCE))
        self.assertEqual(packed.usage.total_tokens, packed.usage.prompt_tokens)
        floats = self.client.embeddings.create(model="any", input=texts, encoding_format="float")
        self.assert_reference_vectors(floats)
        for a, b in zip(packed.data, floats.data):
            self.assertTrue(all(abs(x - y) < 1e-6 for x, y in zip(a.embedding, b.embedding)))
        # Token ids embed as the text they are.
        by_ids = self.client.embeddings.create(model="any", input=[REFERENCE[1]["tokens"]], encoding_format="float")
        self.assertGreaterEqual(cosine(by_ids.data[0].embedding, REFERENCE[1]["vector"]), 0.999)
        self.assertEqual(by_ids.usage.prompt_tokens, len(REFERENCE[1]["tokens"]))

    def test_dimensions_keep_the_first_values_normalized(self):
        case = REFERENCE[2]
        short = self.client.embeddings.create(model="any", input=case["text"], dimensions=64).data[0].embedding
        self.assertEqual(len(short), 64)
        self.assertAlmostEqual(norm(short), 1.0, places=5)
        self.assertGreaterEqual(cosine(short, case["vector"][:64]), 0.999)

    def test_bad_requests_and_generation_get_openai_errors(self):
        def refused(status, code, call):
            with self.assertRaises(openai.APIStatusError) as caught:
                call()
            self.assertEqual((caught.exception.status_code, caught.exception.code), (status, code), caught.exception.body)
            return caught.exception

        before = metrics(self.address)
        message = [{"role": "user", "content": "Hello"}]
        e = refused(400, "invalid_option", lambda: self.client.chat.completions.create(model="m", messages=message))
        self.assertIn("embedding model", e.message)
        e = refused(400, "invalid_option", lambda: self.client.completions.create(model="m", prompt=PROMPT))
        self.assertIn("embedding model", e.message)
        e = refused(400, "invalid_option", lambda: self.client.embeddings.create(model="m", input=["a", ""]))
        self.assertEqual(e.param, "input")
        long = "word " * 600
        # The server's name for a prompt past the context, as for the completions endpoints.
        refused(400, "context_length_exceeded", lambda: self.client.embeddings.create(model="m", input=long))
        cut = self.client.embeddings.create(model="m", input=long, extra_body={"truncate": True})
        self.assertEqual(cut.usage.prompt_tokens, 512, "cut to the model's context")
        self.assertAlmostEqual(norm(cut.data[0].embedding), 1.0, places=5)
        refused(400, "invalid_option", lambda: self.client.embeddings.create(model="m", input="a", dimensions=385))
        status, _, error = request(self.address, "POST", "/v1/rerank", {"query": "q", "documents": ["a"]})
        self.assertEqual((status, error["error"]["code"], error["error"]["param"]), (400, "invalid_option", "model"))
        self.assertIn("embedding model", error["error"]["message"])
        bad_key = openai.OpenAI(base_url=f"http://{self.address}/v1", api_key="wrong", max_retries=0)
        refused(401, "invalid_api_key", lambda: bad_key.embeddings.create(model="m", input="a"))
        bad_key.close()
        status, _, error = request(self.address, "POST", "/v1/embeddings", "{not json", {"Content-Type": "application/json"})
        self.assertEqual((status, error["error"]["code"]), (400, "invalid_json"))
        after = metrics(self.address)
        delta = lambda endpoint, outcome: (sample(after, "kestrel_requests_total", endpoint=endpoint, outcome=outcome)
                                           - sample(before, "kestrel_requests_total", endpoint=endpoint, outcome=outcome))
        self.assertEqual(delta("chat_completions", "invalid_option"), 1)
        self.assertEqual(delta("completions", "invalid_option"), 1)
        self.assertEqual(delta("embeddings", "invalid_option"), 2)
        self.assertEqual(delta("embeddings", "context_length_exceeded"), 1)
        self.assertEqual(delta("embeddings", "invalid_api_key"), 1)
        self.assertEqual(delta("embeddings", "ok"), 1)
        self.assertEqual(delta("rerank", "invalid_option"), 1)

    def test_models_health_and_metrics_describe_the_embedding_model(self):
        self.assertEqual(self.client.models.list().data[0].id, "all-MiniLM-L6-v2.f32")
        status, _, health = request(self.address, "GET", "/health", key=None)
        self.assertEqual((status, health["status"], health["model_type"], health["backend"]), (200, "ok", "embedding", "cpu"))
        before = metrics(self.address)
        answer = self.client.embeddings.create(model="m", input=["Hello world", "x"])
        after = metrics(self.address)
        delta = lambda name, **labels: sample(after, name, **labels) - sample(before, name, **labels)
        self.assertEqual(delta("kestrel_requests_total", endpoint="embeddings", outcome="ok"), 1)
        self.assertEqual(delta("kestrel_embedding_inputs_total"), 2)
        self.assertEqual(delta("kestrel_embedding_tokens_total"), answer.usage.prompt_tokens)
        self.assertEqual(delta("kestrel_embedding_request_duration_seconds_count"), 1)
        self.assertGreater(delta("kestrel_embedding_request_duration_seconds_sum"), 0)
        self.assertGreater(sample(after, "kestrel_model_memory_bytes"), 80 << 20, "MiniLM's f32 weights")
        self.assertEqual(sample(after, "kestrel_queue_depth"), 0)

    def test_the_server_answers_others_while_it_embeds_and_refuses_past_its_queue(self):
        # Embedding runs on a thread of its own, not on the async runtime: with two large
        # requests in (one running, one queued behind it), as many as this machine's runtime has
        # worker threads, /health still answers at once.
        # About 650 tokens each: seconds on two cores, long enough to be seen running.
        texts = [[f"{i} " + "a sentence of several words to embed " * 40 for i in range(2 * r, 2 * r + 2)] for r in range(2)]
        answers = {}
        embed = lambda r: answers.update({r: self.client.embeddings.create(model="m", input=texts[r])})
        workers = [threading.Thread(target=embed, args=(r,)) for r in range(2)]
        for worker in workers:
            worker.start()
        deadline = time.time() + 30
        while request(self.address, "GET", "/health")[2]["pending_requests"] < 2:
            self.assertLess(time.time(), deadline, "the embeddings requests never arrived")
            self.assertTrue(all(w.is_alive() for w in workers), "a request ended before /health saw both: make them larger")
            time.sleep(0.01)
        started = time.time()
        status, _, health = request(self.address, "GET", "/health")
        self.assertLess(time.time() - started, 0.5)
        self.assertEqual((status, health["pending_requests"]), (200, 2), "both were still in while /health answered")
        # One running and one queued fill `--queue 1`: a third is refused at once.
        status, headers, error = request(self.address, "POST", "/v1/embeddings", {"input": "x"})
        self.assertEqual((status, error["error"]["code"]), (429, "rate_limit_exceeded"))
        self.assertGreaterEqual(int(headers["Retry-After"]), 1)
        for worker in workers:
            worker.join(timeout=300)
        self.assertEqual([len(answers[r].data) for r in range(2)], [2, 2])


class RerankServerTest(unittest.TestCase):
    """A server over a reranker: /v1/rerank (llama.cpp server's, Jina's and Cohere's shape) gives
    llama.cpp's scores, best first; `relevance_score` is the probability node-llama-cpp's rankAll
    gives (the sigmoid of the head's logit), in [0, 1]."""

    @classmethod
    def setUpClass(cls):
        cls.ranked = json.loads(RANKED.read_text())
        cls.process, cls.address = start_server("--model", str(RERANKER), "--api-key", API_KEY)

    @classmethod
    def tearDownClass(cls):
        cls.process.send_signal(signal.SIGTERM)
        cls.process.wait(timeout=60)
        cls.process.stderr.close()

    def rerank(self, body):
        return request(self.address, "POST", "/v1/rerank", body)

    def test_scores_are_llama_cpp_s_best_first(self):
        cases = self.ranked["cases"]
        documents = [case["document"] for case in cases]
        before = metrics(self.address)
        status, _, answer = self.rerank({"model": "bge", "query": self.ranked["query"], "documents": documents})
        after = metrics(self.address)
        self.assertEqual(status, 200, answer)
        self.assertEqual((answer["model"], answer["object"]), ("bge", "list"))
        results = answer["results"]
        self.assertEqual(sorted(r["index"] for r in results), list(range(len(cases))))
        scores = [r["relevance_score"] for r in results]
        self.assertEqual(scores, sorted(scores, reverse=True), "best first")
        for r in results:
            want = cases[r["index"]]["score"]
            self.assertLess(abs(r["relevance_score"] - want), 1e-3, cases[r["index"]]["document"])
            self.assertTrue(0 <= r["relevance_score"] <= 1)
            self.assertNotIn("document", r)
        tokens = sum(len(case["tokens"]) for case in cases)
        self.assertEqual(answer["usage"], {"prompt_tokens": tokens, "total_tokens": tokens})
        delta = lambda name, **labels: sample(after, name, **labels) - sample(before, name, **labels)
        self.assertEqual(delta("kestrel_requests_total", endpoint="rerank", outcome="ok"), 1)
        self.assertEqual(delta("kestrel_rerank_documents_total"), len(cases))
        self.assertEqual(delta("kestrel_rerank_tokens_total"), tokens)
        self.assertEqual(delta("kestrel_rerank_request_duration_seconds_count"), 1)

        # top_n keeps the best; return_documents gives their texts; the model's name by default.
        status, _, top = self.rerank({"query": self.ranked["query"], "documents": documents, "top_n": 2, "return_documents": True})
        self.assertEqual(status, 200, top)
        self.assertEqual(top["model"], "synthetic-bert-pool4-f32")
        self.assertEqual([r["index"] for r in top["results"]], [r["index"] for r in results[:2]])
        self.assertEqual([r["document"]["text"] for r in top["results"]], [documents[r["index"]] for r in results[:2]])

    def test_bad_requests_get_their_codes(self):
        before = metrics(self.address)
        bad = [
            ({"query": "", "documents": ["a"]}, "query"),
            ({"query": "q", "documents": []}, "documents"),
            ({"query": "q"}, "documents"),
            ({"query": "q", "documents": ["a"] * 2049}, "documents"),
            ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
            ({"query": "q", "documents": ["a"], "rank_fields": ["text"]}, "rank_fields"),
        ]
        for body, param in bad:
            status, _, error = self.rerank(body)
            self.assertEqual((status, error["error"]["code"], error["error"]["param"]), (400, "invalid_option", param), body)
        status, _, error = self.rerank("{not json")
        self.assertEqual((status, error["error"]["code"]), (400, "invalid_json"))
        # A pair past the model's context (128 tokens), as the embeddings endpoint names it.
        status, _, error = self.rerank({"query": "q", "documents": ["word " * 200]})
        self.assertEqual((status, error["error"]["code"]), (400, "context_length_exceeded"))
        # A reranker does not embed.
        status, _, error = request(self.address, "POST", "/v1/embeddings", {"input": "a"})
        self.assertEqual((status, error["error"]["code"]), (400, "invalid_option"))
        self.assertIn("reranker", error["error"]["message"])
        status, _, health = request(self.address, "GET", "/health")
        self.assertEqual((status, health["model_type"], health["backend"]), (200, "reranker", "cpu"))
        status, _, error = request(self.address, "POST", "/v1/rerank", {"query": "q", "documents": ["a"]}, key="wrong")
        self.assertEqual((status, error["error"]["code"]), (401, "invalid_api_key"))
        after = metrics(self.address)
        delta = lambda outcome: (sample(after, "kestrel_requests_total", endpoint="rerank", outcome=outcome)
                                 - sample(before, "kestrel_requests_total", endpoint="rerank", outcome=outcome))
        self.assertEqual(delta("invalid_option"), len(bad))
        self.assertEqual(delta("invalid_json"), 1)
        self.assertEqual(delta("context_length_exceeded"), 1)
        self.assertEqual(delta("invalid_api_key"), 1)
        self.assertEqual(delta("ok"), 0)


class BatchTest(unittest.TestCase):
    """Requests that arrive together run as one batch and give what each gives alone."""

    def test_concurrent_requests_give_what_the_cli_gives_for_each_alone(self):
        process, address = start_server()  # the default: 8 slots on the CPU backend
        try:
            self.assertEqual(request(address, "GET", "/health")[2]["slots"], 8)
            client = openai.OpenAI(base_url=f"http://{address}/v1", api_key="none", max_retries=0, timeout=300)
            prompts = [PROMPT, "Once upon a time", "def fibonacci(n):", "The three primary colours are",
                       "In 1969, the first", "Water boils at", "My favourite book is", "Dear diary, today I"]
            # Six greedy requests of different lengths, two sampled with a seed and a penalty.
            runs = [(p, 6 + 3 * i, {}) for i, p in enumerate(prompts[:6])]
            runs += [(p, 8, {"temperature": 0.8, "seed": 5 + i, "frequency_penalty": 0.5}) for i, p in enumerate(prompts[6:])]
            cli_options = lambda o: [x for k, v in o.items() for x in (f"--{k.replace('_', '-')}", str(v))]
            expected = [native_greedy(p, n, *cli_options(o)) for p, n, o in runs]
            before = metrics(address)

            def complete(run):
                p, n, options = run
                chunks = list(client.completions.create(model="m", prompt=p, max_tokens=n, stream=True,
                                                        **{"temperature": 0, **options}))
                return "".join(c.choices[0].text for c in chunks if c.choices), chunks[-1].model_extra["kestrel"]["token_ids"]

            with ThreadPoolExecutor(len(runs)) as pool:
                results = list(pool.map(complete, runs))
            for (text, ids), want, run in zip(results, expected, runs):
                self.assertEqual(ids, want["token_ids"], run)
                self.assertEqual(text, want["text"], run)
            after = metrics(address)
            steps = sample(after, "kestrel_batch_size_count") - sample(before, "kestrel_batch_size_count")
            sequences = sample(after, "kestrel_batch_size_sum") - sample(before, "kestrel_batch_size_sum")
            self.assertGreater(sequences / steps, 2, "the requests ran in batches")
            self.assertEqual(sample(after, "kestrel_slots_in_use"), 0)
            client.close()
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
            process.stderr.close()


class SpeculativeTest(unittest.TestCase):
    """`kestrel serve --lookup`: prompt-lookup drafts verified several tokens a step, with the
    tokens of plain greedy decoding, and their acceptance in /metrics."""

    def test_lookup_gives_plain_tokens_and_reports_its_acceptance(self):
        process, address = start_server("--backend", "cpu", "--lookup", "--slots", "2")
        try:
            client = openai.OpenAI(base_url=f"http://{address}/v1", api_key="none", max_retries=0, timeout=300)
            # A text that repeats itself: its second half is drafted from its first.
            prompt = "one two three four five six seven eight nine ten. one two three four five six seven eight nine ten. one two"
            want = native_greedy(prompt, 24)
            before = metrics(address)
            answer = client.completions.create(model="m", prompt=prompt, max_tokens=24, temperature=0)
            self.assertEqual(answer.model_extra["kestrel"]["token_ids"], want["token_ids"])
            plain = client.completions.create(model="m", prompt=prompt, max_tokens=24, temperature=0,
                                              extra_body={"speculative": False})
            self.assertEqual(plain.model_extra["kestrel"]["token_ids"], want["token_ids"])
            after = metrics(address)
            verified = sample(after, "kestrel_speculative_acceptance_count") - sample(before, "kestrel_speculative_acceptance_count")
            self.assertEqual(verified, 1, "one request speculated (the other asked not to)")
            per_step = sample(after, "kestrel_speculative_tokens_per_step_sum") - sample(before, "kestrel_speculative_tokens_per_step_sum")
            self.assertGreater(per_step, 1.0, "drafts stood")
            client.close()
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
            process.stderr.close()


class ShutdownTest(unittest.TestCase):
    def test_sigterm_finishes_running_requests_within_the_grace_and_exits(self):
        process, address = start_server("--shutdown-grace", "1")
        connection = http.client.HTTPConnection(address, timeout=120)
        connection.request("POST", "/v1/completions", json.dumps({"prompt": PROMPT, "max_tokens": 400, "ignore_eos": True, "stream": True}))
        stream = connection.getresponse()
        self.assertTrue(stream.readline().startswith(b"data: "))
        process.send_signal(signal.SIGTERM)
        events = [line[6:] for line in stream.read().decode().splitlines() if line.startswith("data: ")]
        self.assertEqual(events[-1], "[DONE]")
        final = json.loads(events[-2])
        self.assertEqual(final["choices"][0]["finish_reason"], "abort", "aborted after the grace period")
        self.assertLess(len(final["kestrel"]["token_ids"]), 400)
        connection.close()
        self.assertEqual(process.wait(timeout=60), 0)
        process.stderr.close()
        with self.assertRaises(ConnectionRefusedError):
            request(address, "GET", "/health")


if __name__ == "__main__":
    unittest.main()
