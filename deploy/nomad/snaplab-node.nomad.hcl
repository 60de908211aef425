# snaplab node daemons as a Nomad system job: one per client node (docs/cluster.md).
#
# What each host needs (raw_exec runs the daemon as root, outside any container, because it
# makes namespaces, cgroups, mounts, loop devices and taps of its own):
#   - the raw_exec driver enabled on the client:  plugin "raw_exec" { config { enabled = true } }
#   - snaplab installed (scripts/setup.sh): /usr/local/bin/snaplab, its Debian packages
#   - a SNAPLAB_HOME on a local disk (/var/lib/snaplab); sandboxes outlive the daemon there
#   - the etcd members' addresses in SNAPLAB_CLUSTER (below)
#
# Upgrading a node without losing its sandboxes: `snaplab cluster drain NODE`, wait for its
# sandboxes' TTLs to end (or move its pools), then let Nomad restart the job with the new version;
# `snaplab cluster drain NODE --undo` once it is back. kill_signal SIGTERM withdraws the node
# from the cluster on purpose (its sandboxes are "unreachable", not "lost", until it returns).
job "snaplab-node" {
  type        = "system"
  datacenters = ["dc1"]

  group "node" {
    # the daemon outlives nothing of its own: let Nomad restart it in place
    restart {
      attempts = 10
      interval = "5m"
      delay    = "5s"
      mode     = "delay"
    }

    network {
      port "api" { static = 7070 }
    }

    task "snaplab" {
      driver = "raw_exec"

      config {
        command = "/usr/local/bin/snaplab"
        args = [
          "serve", "--node",
          "--listen", "${NOMAD_IP_api}:${NOMAD_PORT_api}",
          "--node-name", "${node.unique.name}",
          "--labels", "datacenter=${node.datacenter},class=${node.class}",
          "--json-logs",
        ]
      }

      env {
        SNAPLAB_HOME    = "/var/lib/snaplab"
        SNAPLAB_CLUSTER = "etcd://10.0.0.11:2379,10.0.0.12:2379,10.0.0.13:2379"
      }

      # SIGTERM: withdraw from the cluster, close the listeners; sandboxes keep running
      kill_signal  = "SIGTERM"
      kill_timeout = "30s"

      resources {
        cpu    = 500
        memory = 512
      }
    }
  }
}
