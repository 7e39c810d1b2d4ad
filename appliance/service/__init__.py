"""The appliance daemon: job store, queue, worker processes, control API on a Unix socket, Prometheus."""
