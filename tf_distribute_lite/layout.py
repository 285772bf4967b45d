"""`Layout`: where a strategy runs, as one frozen value."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where a strategy's replicas run, seen from this process: one canonical
  device per local replica, workers in sync and this one's index, its task
  in a cluster, and `task`, the server it started ("" if none).

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

  num_replicas = property(lambda self: len(self.devices) * self.num_workers,
                          doc="The replicas in sync, on every worker.")
  replica_offset = property(lambda self: self.worker_index * len(self.devices),
                            doc="The global id of this worker's first replica.")
