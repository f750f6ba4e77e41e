"""A hub model's snapshot is checked before it is used (fewerpasses/core/fetch.py:
snapshot_problems), and an incomplete one is resumed, saying so in the log.

The hub is a real HTTP server on loopback that answers the requests huggingface_hub's
snapshot_download makes (the repository's revision, its file tree, each file's HEAD and GET,
with the headers it reads: X-Repo-Commit, ETag, Content-Length), reached through
HF_ENDPOINT, as tests/test_fetched_sets.py serves Spec-Bench's file. The cache is laid out by
huggingface_hub itself, downloading from that server; an interrupted download is then made
of it as a closed lid leaves one: a shard's link and blob gone, a partial temporary blob left.
Each fetch runs in a process of its own, since huggingface_hub reads HF_* at import."""

import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from tiny_models import write_model_dir, write_sharded_copy

REPO_ID = "fewerpasses-test/tiny-sharded"
COMMIT = hashlib.sha1(b"fewerpasses-test/tiny-sharded@1").hexdigest()
MISSING = "model-00002-of-00002.safetensors"


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Hub:
    """The repository's files, as the hub describes and serves them: a git blob id for each,
    an LFS sha256 (the ETag the hub gives) for each safetensors file."""

    def __init__(self, files: dict):
        self.files = files
        self.requests = []

    def etag(self, name: str) -> str:
        data = self.files[name]
        return hashlib.sha256(data).hexdigest() if name.endswith(".safetensors") else git_blob_id(data)

    def tree(self):
        entries = []
        for name, data in sorted(self.files.items()):
            entry = {"type": "file", "oid": git_blob_id(data), "size": len(data), "path": name}
            if name.endswith(".safetensors"):
                entry["lfs"] = {"oid": self.etag(name), "size": len(data), "pointerSize": 134}
            entries.append(entry)
        return entries


def handler_for(hub: Hub):
    models, resolve = f"/api/models/{REPO_ID}/", f"/{REPO_ID}/resolve/"

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def answer(self, status, body: bytes, headers=(), send_body=True):
            self.send_response(status)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if send_body:
                self.wfile.write(body)

        def serve(self, send_body: bool):
            path = unquote(urlparse(self.path).path)
            hub.requests.append((self.command, path))
            if path.startswith(models + "revision/"):
                info = {"id": REPO_ID, "sha": COMMIT, "siblings": [{"rfilename": f} for f in sorted(hub.files)]}
                return self.answer(200, json.dumps(info).encode(), [("Content-Type", "application/json")], send_body)
            if path.startswith(models + "tree/"):
                return self.answer(200, json.dumps(hub.tree()).encode(), [("Content-Type", "application/json")])
            if path.startswith(resolve):
                _, name = path[len(resolve) :].split("/", 1)
                if name in hub.files:
                    headers = [
                        ("X-Repo-Commit", COMMIT),
                        ("ETag", f'"{hub.etag(name)}"'),
                        ("Content-Type", "application/octet-stream"),
                    ]
                    return self.answer(200, hub.files[name], headers, send_body)
                return self.answer(404, b"Entry not found", [("X-Error-Code", "EntryNotFound")], send_body)
            return self.answer(404, b"Repository not found", [("X-Error-Code", "RepoNotFound")], send_body)

        def do_GET(self):
            self.serve(True)

        def do_HEAD(self):
            self.serve(False)

    return Handler


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    model = write_sharded_copy(write_model_dir(root / "single", "llama", layers=2), root / "sharded")
    files = {f.name: f.read_bytes() for f in sorted(model.iterdir()) if f.is_file()}
    assert MISSING in files and "model.safetensors.index.json" in files and "tokenizer.json" in files
    served = Hub(files)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler_for(served))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    served.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield served
    httpd.shutdown()


FETCH = """
import json, sys
from fewerpasses.core.fetch import FetchError, fetch
try:
    info = fetch("tiny", sys.argv[1], log=lambda m: print("LOG", m, file=sys.stderr))
except FetchError as e:
    print("FETCHERROR", e, file=sys.stderr)
    sys.exit(3)
print(json.dumps(info))
"""


def run_fetch(hub: Hub, cache: Path, offline: bool = False):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(
        HF_ENDPOINT=hub.url,
        HF_HOME=str(cache.parent / "hf_home"),
        HF_HUB_CACHE=str(cache),
        HF_HUB_OFFLINE="1" if offline else "0",
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_XET="1",
        HF_HUB_DISABLE_IMPLICIT_TOKEN="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
    )
    return subprocess.run([sys.executable, "-c", FETCH, REPO_ID], capture_output=True, text=True, env=env, timeout=180)


def storage(cache: Path) -> Path:
    return cache / ("models--" + REPO_ID.replace("/", "--"))


@pytest.fixture
def interrupted(hub, tmp_path):
    """A cache huggingface_hub laid out from the server, then a download of it interrupted:
    the second shard's link and blob are gone and a partial temporary blob is left."""

    def make(keep_file_list: bool) -> Path:
        cache = tmp_path / "hub"
        first = run_fetch(hub, cache)
        assert first.returncode == 0, first.stderr
        assert json.loads(first.stdout)["kind"] == "hub"
        repo = storage(cache)
        assert (repo / "refs" / "main").read_text() == COMMIT
        link = repo / "snapshots" / COMMIT / MISSING
        assert link.is_symlink(), "huggingface_hub links each file of a snapshot to its blob"
        blob = link.resolve()
        link.unlink()
        (blob.parent / f"{blob.name}.1a2b3c4d.incomplete").write_bytes(hub.files[MISSING][:100])
        blob.unlink()
        if not keep_file_list:
            # huggingface_hub before it cached a repository's file tree leaves no trees/.
            for f in (repo / "trees").glob("*.json"):
                f.unlink()
        hub.requests.clear()
        return cache

    return make


def test_a_complete_snapshot_is_used_from_the_cache_offline(hub, tmp_path):
    cache = tmp_path / "hub"
    assert run_fetch(hub, cache).returncode == 0
    hub.requests.clear()
    again = run_fetch(hub, cache, offline=True)
    assert again.returncode == 0, again.stderr
    info = json.loads(again.stdout)
    assert info["kind"] == "hub-cache" and Path(info["path"]) == storage(cache) / "snapshots" / COMMIT
    assert hub.requests == [] and "incomplete" not in again.stderr


@pytest.mark.parametrize("keep_file_list", [True, False], ids=["with-hub-file-list", "without-file-list"])
def test_an_incomplete_snapshot_is_resumed_and_the_log_says_so(hub, interrupted, keep_file_list):
    cache = interrupted(keep_file_list)
    proc = run_fetch(hub, cache)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["kind"] == "hub-resumed"
    log = [line for line in proc.stderr.splitlines() if line.startswith("LOG")]
    assert any("is incomplete" in line and MISSING in line for line in log), proc.stderr
    assert any("resumed the snapshot" in line for line in log), proc.stderr
    assert (Path(info["path"]) / MISSING).read_bytes() == hub.files[MISSING]
    # Only the missing file was downloaded again.
    fetched = {p.rsplit("/", 1)[1] for method, p in hub.requests if "/resolve/" in p}
    assert fetched == {MISSING}


@pytest.mark.parametrize("keep_file_list", [True, False], ids=["with-hub-file-list", "without-file-list"])
def test_offline_an_incomplete_snapshot_is_refused_naming_the_missing_file(hub, interrupted, keep_file_list):
    cache = interrupted(keep_file_list)
    proc = run_fetch(hub, cache, offline=True)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    error = next(line for line in proc.stderr.splitlines() if line.startswith("FETCHERROR"))
    assert "model 'tiny'" in error and MISSING in error and "incomplete" in error
    assert hub.requests == []
    assert not (storage(cache) / "snapshots" / COMMIT / MISSING).exists()
