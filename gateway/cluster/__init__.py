"""Several hosts behind one gateway (docs/cluster.md): one plan over every host's GPUs, a host agent per host.

    hosts = load_cluster_file(Path("cluster.yaml"))     # simulated hosts; or hosts_from_agents(agents, config)
    report = plan_cluster(config, hosts)                # each model on one host, explained per host
    config, report = plan_cluster_with_replicas(config, hosts)  # the same, each `replicas: auto` chosen first
    report.host_of("m"), report.plans_by_host()

Nothing here imports Ray; only `gateway.cluster.ray_agent` does (the `cluster` extra).
"""

from gateway.cluster.agent import HostAgent, HostLost, HostReport, UnknownWorker, WorkerReport
from gateway.cluster.hosts import ClusterFileError, HostView, load_cluster_file
from gateway.cluster.plan import ClusterDecision, ClusterReport, HostPlacement, plan_cluster, plan_cluster_with_replicas

__all__ = [
    "ClusterDecision",
    "ClusterFileError",
    "ClusterReport",
    "HostAgent",
    "HostLost",
    "HostPlacement",
    "HostReport",
    "HostView",
    "UnknownWorker",
    "WorkerReport",
    "load_cluster_file",
    "plan_cluster",
    "plan_cluster_with_replicas",
]
