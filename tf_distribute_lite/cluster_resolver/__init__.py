"""`tf.distribute.cluster_resolver`: where the tasks of a cluster are."""

from tf_distribute_lite.cluster_resolver.cluster_resolver import ClusterResolver
from tf_distribute_lite.cluster_resolver.cluster_resolver import SimpleClusterResolver
from tf_distribute_lite.cluster_resolver.cluster_resolver import UnionResolver
from tf_distribute_lite.cluster_resolver.gce_cluster_resolver import GCEClusterResolver
from tf_distribute_lite.cluster_resolver.kubernetes_cluster_resolver import KubernetesClusterResolver
from tf_distribute_lite.cluster_resolver.kubernetes_cluster_resolver import KubernetesExecutableLocation
from tf_distribute_lite.cluster_resolver.slurm_cluster_resolver import SlurmClusterResolver
from tf_distribute_lite.cluster_resolver.tfconfig_cluster_resolver import TFConfigClusterResolver
from tf_distribute_lite.cluster_resolver.tpu_cluster_resolver import TPUClusterResolver

# The namespace has TensorFlow's names only: importing the modules above made
# them attributes of this package. They stay importable by their full names.
del (cluster_resolver, gce_cluster_resolver,  # pylint: disable=undefined-variable
     kubernetes_cluster_resolver, slurm_cluster_resolver, tfconfig_cluster_resolver,
     tpu_cluster_resolver)
