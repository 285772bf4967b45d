"""A fake GCE metadata server and Cloud TPU API on 127.0.0.1, and a fake
googleapiclient-style TPU service, for the TPU resolver tests."""

import collections
import http.server
import json
import threading
import time
from types import SimpleNamespace as Obj


class FakeCloud:
  """Answers GETs from `routes`: path -> list of (status, body, delay); each
  request takes the first entry, and the last one stays. Metadata paths
  answer 404 without the `Metadata-Flavor: Google` header, as GCE's do."""

  def __init__(self):
    self.routes = {}
    self.hits = collections.Counter()
    self.headers = {}
    fake = self

    class Handler(http.server.BaseHTTPRequestHandler):

      def do_GET(self):  # pylint: disable=invalid-name
        fake.hits[self.path] += 1
        fake.headers[self.path] = dict(self.headers)
        answers = fake.routes.get(self.path)
        if answers is None or (self.path.startswith("/computeMetadata/") and
                               self.headers.get("Metadata-Flavor") != "Google"):
          status, body, delay = 404, "not found", 0
        else:
          status, body, delay = answers[0] if len(answers) == 1 else answers.pop(0)
        time.sleep(delay)
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        try:
          self.send_response(status)
          self.send_header("Content-Length", str(len(data)))
          self.end_headers()
          self.wfile.write(data)
        except OSError:
          pass  # the client gave up waiting

      def log_message(self, *args):
        pass

    self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.server.daemon_threads = True
    self.address = f"127.0.0.1:{self.server.server_address[1]}"
    # A short poll interval: `close()` waits up to one interval.
    self._thread = threading.Thread(target=self.server.serve_forever,
                                    kwargs={"poll_interval": 0.02}, daemon=True)
    self._thread.start()

  def answer(self, path, *answers):
    """Answers GET `path` with each (status, body[, delay]) in turn."""
    self.routes[path] = [a if len(a) == 3 else (*a, 0) for a in answers]

  def metadata(self, path, body, status=200, delay=0):
    self.answer(f"/computeMetadata/v1/{path}", (status, body, delay))

  def node(self, project, zone, name, *answers):
    self.answer(f"/v1/projects/{project}/locations/{zone}/nodes/{name}", *answers)

  def close(self):
    self.server.shutdown()
    self.server.server_close()


class FakeTpuService:
  """`service.projects().locations().nodes().get(name=...).execute()` over
  a dict of node name -> node description (or exception to raise)."""

  def __init__(self, nodes):
    self.nodes = nodes
    self.calls = 0

  def projects(self):
    def get(name):
      self.calls += 1
      answer = self.nodes[name]
      if isinstance(answer, Exception):
        def fail():
          raise answer
        return Obj(execute=fail)
      return Obj(execute=lambda: answer)
    return Obj(locations=lambda: Obj(nodes=lambda: Obj(get=get)))


def node(state="READY", hosts=1, legacy=False):
  """A Cloud TPU node description with `hosts` hosts."""
  if legacy:
    return {"state": state, "ipAddress": "10.240.1.2", "port": "8470"}
  return {"state": state, "networkEndpoints": [
      {"ipAddress": f"10.240.1.{i + 2}", "port": 8470} for i in range(hosts)]}
