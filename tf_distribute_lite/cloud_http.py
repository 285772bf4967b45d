"""Plain HTTP calls to the GCE metadata server and the Cloud TPU API, with a
timeout on every call and bounded retries with backoff, from the standard
library alone.

Settings (environment variables, read at each call):

* `GCE_METADATA_HOST`, else `GCE_METADATA_IP`, else metadata.google.internal:
  the metadata server, as Google's libraries read it;
* `TF_DISTRIBUTE_LITE_HTTP_TIMEOUT`: seconds one try may take (default 5);
* `TF_DISTRIBUTE_LITE_HTTP_RETRIES`: tries after the first for a server
  error or a timeout (default 2; the wait doubles from 0.2 s);
* `TF_DISTRIBUTE_LITE_TPU_API_ENDPOINT`: the Cloud TPU API's root URL
  (default https://tpu.googleapis.com), for tests and private endpoints;
* `TF_DISTRIBUTE_LITE_TPU_CACHE_SECONDS`: how long the addresses of a READY
  TPU node are reused before the API is asked again (default 10; 0 asks at
  every call, as TensorFlow does);
* `TPU_API_DISCOVERY_URL`: as in TensorFlow, a discovery document to take
  that root from, overriding `TPUClusterResolver(discovery_url=...)`.
"""

import json
import os
import socket
import time
import urllib.error
import urllib.request

TIMEOUT_VARIABLE = "TF_DISTRIBUTE_LITE_HTTP_TIMEOUT"
RETRIES_VARIABLE = "TF_DISTRIBUTE_LITE_HTTP_RETRIES"
ENDPOINT_VARIABLE = "TF_DISTRIBUTE_LITE_TPU_API_ENDPOINT"
CACHE_VARIABLE = "TF_DISTRIBUTE_LITE_TPU_CACHE_SECONDS"
DISCOVERY_VARIABLE = "TPU_API_DISCOVERY_URL"
DEFAULT_TIMEOUT_SECONDS = 5.0
DEFAULT_RETRIES = 2
DEFAULT_CACHE_SECONDS = 10.0
DEFAULT_TPU_API_ENDPOINT = "https://tpu.googleapis.com"
_FIRST_BACKOFF_SECONDS = 0.2


def _setting(name, default, kind):
  given = os.environ.get(name)
  if not given:
    return default
  try:
    value = kind(given)
  except ValueError:
    value = -1
  if value < 0:
    raise ValueError(f"${name} must be a non-negative number; it is {given!r}.")
  return value


def cache_seconds():
  """Seconds a READY TPU node's addresses are reused.

  >>> import os
  >>> os.environ.pop(CACHE_VARIABLE, None) and None
  >>> cache_seconds()
  10.0
  """
  return _setting(CACHE_VARIABLE, DEFAULT_CACHE_SECONDS, float)


def metadata_root():
  """The metadata server's URL.

  >>> import os
  >>> os.environ.pop("GCE_METADATA_HOST", None) and None
  >>> os.environ.pop("GCE_METADATA_IP", None) and None
  >>> metadata_root()
  'http://metadata.google.internal'
  """
  host = (os.environ.get("GCE_METADATA_HOST") or
          os.environ.get("GCE_METADATA_IP", "metadata.google.internal"))
  return "http://" + host


def tpu_api_root(discovery_url=None):
  """The Cloud TPU API's root URL: `$TF_DISTRIBUTE_LITE_TPU_API_ENDPOINT`,
  else the `rootUrl` of the discovery document at `$TPU_API_DISCOVERY_URL`
  or `discovery_url` (a URL or, as for Google's API client, a template with
  `{api}` and `{apiVersion}`), else Google's.

  >>> tpu_api_root()
  'https://tpu.googleapis.com'
  """
  if os.environ.get(ENDPOINT_VARIABLE):
    return os.environ[ENDPOINT_VARIABLE].rstrip("/")
  discovery_url = os.environ.get(DISCOVERY_VARIABLE) or discovery_url
  if discovery_url:
    url = discovery_url.replace("{api}", "tpu").replace("{apiVersion}", "v1")
    document = get_json(url)
    return (document.get("rootUrl", "") + document.get("servicePath", "")).rstrip("/")
  return DEFAULT_TPU_API_ENDPOINT


def get(url, headers=None, timeout=None, retries=None):
  """The body of a GET of `url` as text; `timeout` (seconds per try) and
  `retries` override the settings above.

  Server errors (5xx), timeouts and dropped connections are retried; other
  HTTP errors raise `urllib.error.HTTPError` at once, an unreachable host
  `urllib.error.URLError`, and a server that never answers `TimeoutError`
  naming the URL and the time allowed.
  """
  if timeout is None:
    timeout = _setting(TIMEOUT_VARIABLE, DEFAULT_TIMEOUT_SECONDS, float)
  if retries is None:
    retries = _setting(RETRIES_VARIABLE, DEFAULT_RETRIES, int)
  request = urllib.request.Request(url, headers=headers or {})
  for attempt in range(retries + 1):
    last_try = attempt == retries
    try:
      with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read().decode("utf-8")
    except urllib.error.HTTPError as e:
      if e.code < 500 or last_try:
        raise urllib.error.HTTPError(
            url, e.code, f"GET {url} failed with HTTP {e.code} {e.reason}",
            e.headers, None) from None
    except (TimeoutError, socket.timeout, ConnectionError) as e:
      if last_try:
        raise TimeoutError(f"GET {url} got no answer within {timeout:g} s "
                           f"({retries + 1} tries; ${TIMEOUT_VARIABLE} sets "
                           f"the time per try): {e}") from None
    except urllib.error.URLError as e:
      if not isinstance(e.reason, (TimeoutError, socket.timeout)) or last_try:
        raise urllib.error.URLError(f"GET {url} failed: {e.reason}") from None
    time.sleep(_FIRST_BACKOFF_SECONDS * 2 ** attempt)
  raise AssertionError("unreachable")


def get_json(url, headers=None):
  """`get(url)` parsed as JSON; a body that is not JSON raises `ValueError`
  quoting its start."""
  text = get(url, headers)
  try:
    return json.loads(text)
  except ValueError:
    raise ValueError(f"GET {url} did not return JSON: {text[:200]!r}") from None


def metadata(path, timeout=None, retries=None):
  """The metadata server's value at `path` (such as "project/project-id").

  The server answers only requests with the header `Metadata-Flavor: Google`.
  """
  return get(f"{metadata_root()}/computeMetadata/v1/{path}",
             {"Metadata-Flavor": "Google"}, timeout, retries)


def access_token():
  """The default service account's OAuth token, from the metadata server."""
  answer = json.loads(metadata("instance/service-accounts/default/token"))
  return answer["access_token"]
