"""Many devices and many hosts: the mesh and sharding rules (`partitioning`) and the multi-host
start-up (`distributed`)."""
