"""An emulated cluster on one machine: network namespaces, bridges and tc caps."""
