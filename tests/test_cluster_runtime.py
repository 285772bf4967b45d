"""What `cluster_runtime` answers about a cluster, its checks of a task, its
start-up timeout and the message of a start that failed. (Joining a cluster
starts a server: the multi-worker tests do that, in worker processes.)"""

import socket

import pytest
import tensorflow as tf

from tf_distribute_lite import cluster_runtime
from tf_distribute_lite import layout as layout_lib

WORKERS = tf.train.ClusterSpec({"worker": ["a:1", "b:2", "c:3"]})
WITH_CHIEF = tf.train.ClusterSpec({"chief": ["c:1"], "worker": ["w:1", "w:2"],
                                   "evaluator": ["e:1"]})


@pytest.mark.parametrize("cluster, task, expected", [
    (WORKERS, ("worker", 0), (3, 0, True, "/job:worker/replica:0/task:0")),
    (WORKERS, ("worker", 2), (3, 2, False, "/job:worker/replica:0/task:0")),
    (WITH_CHIEF, ("chief", 0), (3, 0, True, "/job:chief/replica:0/task:0")),
    (WITH_CHIEF, ("worker", 0), (3, 1, False, "/job:chief/replica:0/task:0")),
    (WITH_CHIEF, ("evaluator", 0), (1, 0, True, "/job:chief/replica:0/task:0")),
    (tf.train.ClusterSpec({"worker": ["a:1"], "ps": ["b:1"]}), ("ps", 0),
     (1, 0, False, "/job:worker/replica:0/task:0")),
])
def test_questions_about_a_cluster(cluster, task, expected):
  layout = cluster_runtime.task_layout(cluster, *task)
  assert (layout.num_workers, layout.worker_index, layout.is_chief,
          cluster_runtime.leader(cluster)) == expected
  assert (layout.task_type, layout.task_id, layout.devices) == (*task, ())


def test_without_a_cluster_a_process_is_alone():
  assert cluster_runtime.task_layout(tf.train.ClusterSpec({}), "worker", 1) == layout_lib.Layout()


@pytest.mark.parametrize("cluster, task_type, task_id, message", [
    ({"worker": ["a:1"]}, None, None, r"`task` entry \(its `type` and `index`\) is missing"),
    ({"worker": ["a:1"]}, "worker", 1, r"task index 1 \(`task.index`\) is outside job 'worker'"),
    ({"worker": ["a:1"]}, "worker", -1, r"task index -1 \(`task.index`\)"),
    ({"worker": ["a:1"]}, "chief", 0, r"task type 'chief' \(`task.type`\) is not a job"),
    ({"worker": ["a:1"], "trainer": ["b:1"]}, "worker", 0, r"jobs \['trainer'\]"),
    ({"chief": ["a:1", "b:1"]}, "chief", 0, r"at most one 'chief' task"),
])
def test_invalid_tasks_raise_value_error_naming_the_field(cluster, task_type, task_id, message):
  with pytest.raises(ValueError, match=message):
    cluster_runtime.validate_task(tf.train.ClusterSpec(cluster), task_type, task_id)


def test_configure_collectives_sets_the_leader_the_task_filter_and_the_allocator():
  config = tf.compat.v1.ConfigProto(device_filters=["/job:old"])
  config.graph_options.rewrite_options.scoped_allocator_opts.enable_op.append("Old")
  cluster_runtime.configure_collectives(config)
  rewrites = config.graph_options.rewrite_options
  assert (rewrites.scoped_allocator_optimization, list(rewrites.scoped_allocator_opts.enable_op),
          list(config.device_filters)) == (rewrites.ON, ["CollectiveReduce"], ["/job:old"])
  cluster_runtime.configure_collectives(config, WITH_CHIEF, "worker", 1)
  assert (config.experimental.collective_group_leader, list(config.device_filters),
          list(rewrites.scoped_allocator_opts.enable_op)) == (
              "/job:chief/replica:0/task:0", ["/job:worker/task:1"], ["CollectiveReduce"])


def test_an_evaluator_need_not_be_in_the_cluster():
  cluster_runtime.validate_task(WORKERS, "evaluator", 0)


def test_startup_timeout_comes_from_the_environment(monkeypatch):
  monkeypatch.delenv(cluster_runtime.STARTUP_TIMEOUT_VARIABLE, raising=False)
  assert cluster_runtime.startup_timeout() == cluster_runtime.DEFAULT_STARTUP_TIMEOUT_SECONDS
  monkeypatch.setenv(cluster_runtime.STARTUP_TIMEOUT_VARIABLE, "2.5")
  assert cluster_runtime.startup_timeout() == 2.5
  for bad in ("soon", "0", "-3"):
    monkeypatch.setenv(cluster_runtime.STARTUP_TIMEOUT_VARIABLE, bad)
    with pytest.raises(ValueError, match="TF_DISTRIBUTE_LITE_STARTUP_TIMEOUT"):
      cluster_runtime.startup_timeout()


def test_failed_start_names_the_tasks_nothing_answers_for():
  with socket.socket() as listening:
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    up = f"127.0.0.1:{listening.getsockname()[1]}"
    with socket.socket() as closed:
      closed.bind(("127.0.0.1", 0))
      down = f"127.0.0.1:{closed.getsockname()[1]}"
    cluster = tf.train.ClusterSpec({"worker": [up, down, up]})
    message = cluster_runtime._startup_failure(  # pylint: disable=protected-access
        cluster, "worker", 0, 5.0, 0.5, "Barrier timed out")
  assert message.startswith("Task /job:worker/replica:0/task:0 could not start the "
                            "cluster within 5 s: no server answers for "
                            f"/job:worker/replica:0/task:1 at {down}.")
  assert "task:2" not in message and "(Barrier timed out)" in message
