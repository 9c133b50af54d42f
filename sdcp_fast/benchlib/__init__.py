"""The bench harness behind ``sdcp-fast bench``: workloads, runs in process and over the
network, peers measured in the same run, figures, the report and its plots. The scripts in
the top-level ``bench/`` folder measure single parts; this package measures deployments."""
