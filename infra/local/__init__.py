"""Emulated clouds for dry runs and tests: moto, fake-gcs-server, a fake Cloud TPU API, TPU-VM hosts."""
