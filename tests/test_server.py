"""fewerpasses.server, through a real HTTP client on loopback: streamed and non-streamed
completions with the server's drafter, a drafter per request, and bad requests (an unknown
drafter, a negative max_tokens, malformed JSON), each answered with a 4xx that names the
problem while the next request still succeeds."""

import http.client
import json
import re
import subprocess
import sys
import threading

import pytest
from mlx_lm import generate as mlx_generate
from mlx_lm import load

from fewerpasses.server import Defaults, make_server, provider_of, request_drafter
from tiny_models import write_chat_teacher

PROMPT = "def add(a, b):\n    return a + b\n\nclass Point:\n"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_chat_teacher(tmp_path_factory.mktemp("srv") / "model")


@pytest.fixture(scope="module")
def server(model_dir):
    path = model_dir
    host, _, provider = provider_of(["--model", str(path), "--port", "0"])
    # No cost file: the gate probes the costs when a drafter first loads.
    httpd, generator = make_server("127.0.0.1", 0, provider, Defaults(drafter="suffix", settings={"num_draft": 4}))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    model, tok = load(str(path))
    yield httpd.server_address[1], model, tok
    httpd.shutdown()
    generator.stop_and_join()


def post(port, path, body, raw=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    data = raw if raw is not None else json.dumps(body).encode()
    conn.request(
        "POST", path, body=data, headers={"Content-Type": "application/json", "Content-Length": str(len(data))}
    )
    r = conn.getresponse()
    return r.status, r.read().decode()


def completion(port, **body):
    status, text = post(port, "/v1/completions", {"prompt": PROMPT, "max_tokens": 16, "temperature": 0.0, **body})
    assert status == 200, text
    return json.loads(text)


def test_a_completion_with_the_servers_drafter_is_greedy_mlx_lm(server):
    port, model, tok = server
    out = completion(port)
    assert out["choices"][0]["text"] == mlx_generate(model, tok, PROMPT, max_tokens=16)


def test_a_request_may_name_its_own_drafter_or_none(server):
    port, model, tok = server
    texts = {d: completion(port, drafter=d)["choices"][0]["text"] for d in ("lookup", "recycle", None)}
    assert len(set(texts.values())) == 1


def test_a_streamed_chat_completion_sends_events_to_the_end(server):
    port, model, tok = server
    body = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 12, "stream": True, "drafter": "lookup"}
    status, text = post(port, "/v1/chat/completions", body)
    assert status == 200
    events = [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert any(c["choices"] and c["choices"][0].get("finish_reason") for c in chunks)
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    whole = json.loads(post(port, "/v1/chat/completions", {**body, "stream": False})[1])
    assert streamed == whole["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    "body, raw, says",
    [
        ({"prompt": PROMPT, "drafter": "ngram"}, None, "unknown drafter 'ngram'"),
        ({"prompt": PROMPT, "max_tokens": -3}, None, "max_tokens must be at least 1"),
        ({"prompt": PROMPT, "drafter": "suffix", "drafter_settings": {"depth": 2}}, None, "no setting depth"),
        ({"prompt": PROMPT, "drafter": "head", "drafter_settings": {"head": "/etc"}}, None, "the server's"),
        (None, b'{"prompt": "unclosed', "Invalid JSON"),
    ],
)
def test_a_bad_request_gets_a_4xx_naming_it_and_the_server_goes_on(server, body, raw, says):
    port, model, tok = server
    status, text = post(port, "/v1/completions", body, raw)
    assert 400 <= status < 500 and says in text
    assert completion(port)["choices"][0]["text"]


def test_request_drafters_default_to_the_servers_and_merge_its_settings():
    d = Defaults(drafter="suffix", settings={"num_draft": 4})
    assert request_drafter({}, d) == ("suffix", {"num_draft": 4})
    assert request_drafter({"drafter": None}, d) == (None, {})
    assert request_drafter({"drafter": "lookup"}, d) == ("lookup", {})
    assert request_drafter({"drafter_settings": {"min_prob": 0.2}}, d) == ("suffix", {"num_draft": 4, "min_prob": 0.2})
    with pytest.raises(ValueError, match="without a drafter"):
        request_drafter({"drafter": None, "drafter_settings": {"num_draft": 2}}, d)


def test_the_command_starts_a_server_with_mlx_lms_flags_and_a_drafter(model_dir):
    cmd = [sys.executable, "-m", "fewerpasses.server", "--model", str(model_dir), "--port", "0", "--max-tokens", "8"]
    proc = subprocess.Popen(cmd + ["--drafter", "lookup"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        port = int(re.search(r"http://[^:]+:(\d+)", line).group(1))
        status, text = post(port, "/v1/completions", {"prompt": PROMPT})
        assert status == 200 and json.loads(text)["usage"]["completion_tokens"] <= 8
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    bad = subprocess.run(cmd + ["--drafter-setting", "num_draft=8"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--drafter-setting needs --drafter" in bad.stderr
