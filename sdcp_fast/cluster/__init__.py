"""Several hosts: the cluster spec, simulated hosts (network namespaces), one host's part
(``sdcp-fast node``) and membership in etcd."""
