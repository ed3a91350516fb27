"""The daemon as a service: the worker, the sensors and rules, and flow reload composed in
one process (``flowrun --daemon``), and the console with an embedded worker."""
