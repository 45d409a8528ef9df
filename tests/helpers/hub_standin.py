"""A local stand-in for the Hugging Face hub, so that the upload is tested through huggingface_hub's own client
against a server on 127.0.0.1, never the network.

It answers the endpoints that `HfApi.create_repo`, `HfApi.upload_folder` (`/api/validate-yaml` for a README.md,
`preupload`, `commit`) and `hf_hub_download` (`HEAD` / `GET .../resolve/<revision>/<file>`) call, as the hub's API
describes them: a write without the token is answered 401, every file is uploaded as a regular (base64) blob (the
preupload answer says so: no LFS or Xet storage to stand in for), and a repository is a folder under `root` whose
files are what the commits wrote. Point huggingface_hub at it with `HF_ENDPOINT=<url>` (a subprocess) or
`HfApi(endpoint=<url>)`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

TOKEN = "hf_standin_token"


class StandIn:
    """The server's state: repositories under `root` (`<namespace>/<name>/<files>`), their visibility, and every
    request seen (method, path)."""

    def __init__(self, root: Path, token: str = TOKEN) -> None:
        self.root, self.token = Path(root), token
        self.private: dict[str, bool] = {}
        self.requests: list[tuple[str, str]] = []
        self.commits: dict[str, int] = {}
        self.url = ""

    def repo(self, repo_id: str) -> Path:
        return self.root / repo_id

    def commit_of(self, repo_id: str) -> str:
        return hashlib.sha1(f"{repo_id}:{self.commits.get(repo_id, 0)}".encode()).hexdigest()


def _handler(hub: StandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
                  content_type: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, status: int, obj: Any) -> None:
            self._send(status, json.dumps(obj).encode())

        def _authorised(self) -> bool:
            if self.headers.get("Authorization") == f"Bearer {hub.token}":
                return True
            self._send(401, json.dumps({"error": "Invalid username or password."}).encode(),
                       {"X-Error-Message": "Invalid username or password."})
            return False

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            hub.requests.append(("POST", self.path))
            path = self.path.split("?")[0]
            body = self._body()
            if path == "/api/validate-yaml":
                content = json.loads(body)["content"]
                try:
                    front = content.split("---\n")[1]
                    yaml.safe_load(front)
                except (IndexError, yaml.YAMLError) as err:
                    return self._json(400, {"error": f"invalid model card metadata: {err}"})
                return self._json(200, {})
            if not self._authorised():
                return None
            if path == "/api/repos/create":
                req = json.loads(body)
                repo_id = f"{req.get('organization') or 'standin-user'}/{req['name']}"
                if hub.repo(repo_id).is_dir():  # as the hub answers: 409 with the existing repository's URL
                    return self._json(409, {"error": "You already created this model repo",
                                            "url": f"{hub.url}/{repo_id}"})
                hub.repo(repo_id).mkdir(parents=True)
                hub.private[repo_id] = req.get("visibility") == "private" or bool(req.get("private"))
                return self._json(200, {"url": f"{hub.url}/{repo_id}", "name": repo_id})
            parts = path.split("/")  # /api/models/<ns>/<name>/<preupload|commit>/<revision>
            if len(parts) == 7 and parts[:3] == ["", "api", "models"]:
                repo_id, action = f"{parts[3]}/{parts[4]}", parts[5]
                if not hub.repo(repo_id).is_dir():
                    return self._send(404, b'{"error": "Repository not found"}',
                                      {"X-Error-Code": "RepoNotFound"})
                if action == "preupload":
                    files = json.loads(body)["files"]
                    return self._json(200, {"files": [{"path": f["path"], "uploadMode": "regular",
                                                       "shouldIgnore": False, "oid": None} for f in files]})
                if action == "commit":
                    for line in body.decode().splitlines():
                        item = json.loads(line)
                        if item["key"] == "file":
                            target = hub.repo(repo_id) / item["value"]["path"]
                            target.parent.mkdir(parents=True, exist_ok=True)
                            target.write_bytes(base64.b64decode(item["value"]["content"]))
                        elif item["key"] != "header":
                            return self._json(400, {"error": f"the stand-in takes regular files only: {item['key']}"})
                    hub.commits[repo_id] = hub.commits.get(repo_id, 0) + 1
                    oid = hub.commit_of(repo_id)
                    return self._json(200, {"commitUrl": f"{hub.url}/{repo_id}/commit/{oid}", "commitOid": oid,
                                            "pullRequestUrl": None})
            return self._json(404, {"error": f"the stand-in has no {path}"})

        def _resolve(self) -> None:
            hub.requests.append((self.command, self.path))
            parts = self.path.split("?")[0].split("/")  # /<ns>/<name>/resolve/<revision>/<file>
            if len(parts) < 6 or parts[3] != "resolve":
                return self._json(404, {"error": "not found"})
            repo_id, file = f"{parts[1]}/{parts[2]}", "/".join(parts[5:])
            target = hub.repo(repo_id) / file
            if not target.is_file():
                code = "RepoNotFound" if not hub.repo(repo_id).is_dir() else "EntryNotFound"
                return self._send(404, b'{"error": "not found"}', {"X-Error-Code": code})
            data = target.read_bytes()
            etag = hashlib.sha256(data).hexdigest()
            return self._send(200, data, {"X-Repo-Commit": hub.commit_of(repo_id), "ETag": f'"{etag}"'},
                              "application/octet-stream")

        do_GET = _resolve  # noqa: N815
        do_HEAD = _resolve  # noqa: N815

    return Handler


@contextmanager
def standin_hub(root: Path, token: str = TOKEN) -> Iterator[StandIn]:
    """A running stand-in hub (its `url` set) storing under `root`; stopped after the block."""
    hub = StandIn(root, token)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
