"""HTTP GETs of the GCE metadata server and the Cloud TPU API (standard library
only), each try with a timeout, retried with backoff. Settings, read at each
call: the `*_VARIABLE` environment variables below and `GCE_METADATA_HOST`
(else `GCE_METADATA_IP`), as Google's libraries read them."""

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


def setting(name, default, kind=float, positive=False):
  """The number environment variable `name` gives (`default` if unset or ""),
  or `ValueError` if it is not a non-negative (or `positive`) number."""
  given = os.environ.get(name)
  if not given:
    return default
  try:
    value = kind(given)
  except ValueError:
    value = -1
  if value < 0 or (positive and value == 0):
    raise ValueError(f"${name} must be a {'positive' if positive else 'non-negative'} "
                     f"number; it is {given!r}.")
  return value


def cache_seconds():
  """Seconds a READY TPU node's addresses are reused."""
  return setting(CACHE_VARIABLE, 10.0, float)


def metadata_root():
  """The metadata server's URL."""
  host = (os.environ.get("GCE_METADATA_HOST") or
          os.environ.get("GCE_METADATA_IP", "metadata.google.internal"))
  return "http://" + host


def tpu_api_root(discovery_url=None):
  """The Cloud TPU API's root URL: `$TF_DISTRIBUTE_LITE_TPU_API_ENDPOINT`, else
  the `rootUrl` of the discovery document at `$TPU_API_DISCOVERY_URL` or
  `discovery_url` (may have `{api}` and `{apiVersion}`), else Google's."""
  if os.environ.get(ENDPOINT_VARIABLE):
    return os.environ[ENDPOINT_VARIABLE].rstrip("/")
  discovery_url = os.environ.get(DISCOVERY_VARIABLE) or discovery_url
  if discovery_url:
    url = discovery_url.replace("{api}", "tpu").replace("{apiVersion}", "v1")
    document = get_json(url)
    return (document.get("rootUrl", "") + document.get("servicePath", "")).rstrip("/")
  return "https://tpu.googleapis.com"


def get(url, headers=None, timeout=None, retries=None):
  """The body of a GET of `url` as text. Server errors (5xx), timeouts and dropped
  connections are retried (waits doubling from 0.2 s); errors name the URL."""
  if timeout is None:
    timeout = setting(TIMEOUT_VARIABLE, 5.0, float)
  if retries is None:
    retries = setting(RETRIES_VARIABLE, 2, int)
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
    time.sleep(0.2 * 2 ** attempt)
  raise AssertionError("unreachable")


def get_json(url, headers=None):
  """`get(url)` parsed as JSON (else `ValueError` quoting the body)."""
  text = get(url, headers)
  try:
    return json.loads(text)
  except ValueError:
    raise ValueError(f"GET {url} did not return JSON: {text[:200]!r}") from None


def metadata(path, timeout=None, retries=None):
  """The metadata server's value at `path`, such as "project/project-id"."""
  return get(f"{metadata_root()}/computeMetadata/v1/{path}",
             {"Metadata-Flavor": "Google"}, timeout, retries)


def access_token():
  """The default service account's OAuth token, from the metadata server."""
  return json.loads(metadata("instance/service-accounts/default/token"))["access_token"]
