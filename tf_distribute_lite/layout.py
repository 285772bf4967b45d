"""`Layout`: where a strategy runs, as one frozen value.

A strategy's extended object asks its layout which devices hold this
process's replicas, how many workers train together and which one this
process is, whether it is the chief, and where its input pipelines run.
`cluster_runtime.join` makes the layout of a task of a cluster; strategies
of one machine make a single-worker one, the TPU strategy one from its
device assignment.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where a strategy's replicas run, seen from this process: `devices`
  (canonical) hold this worker's replicas, one each; `input_host` runs its
  input pipelines (a name, canonicalised where used, as names depend on the
  graph mode); `num_workers` processes train in sync, this one at
  `worker_index` (the chief first); `is_chief` writes checkpoints and
  summaries; `task_type` and `task_id` name its task in a cluster (None
  without one); `task` is the task whose server it started ("" if none).

  >>> layout = Layout(("/gpu:0", "/gpu:1"), num_workers=3, worker_index=2)
  >>> layout.num_replicas, layout.replica_offset
  (6, 4)
  """

  devices: tuple = ()
  input_host: str = "/device:CPU:0"
  num_workers: int = 1
  worker_index: int = 0
  is_chief: bool = True
  task_type: str = None
  task_id: int = None
  task: str = ""

  @property
  def num_replicas(self):
    """The replicas in sync: this worker's times the workers."""
    return len(self.devices) * self.num_workers

  @property
  def replica_offset(self):
    """The global id of this worker's first replica."""
    return self.worker_index * len(self.devices)
