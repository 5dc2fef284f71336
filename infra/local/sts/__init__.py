"""A fake Storage Transfer Service (``storagetransfer.v1``), built the way moto builds a service.

``urls`` (routing), ``responses`` (HTTP only), ``models`` (jobs and operations as a state machine,
usable without HTTP), ``exceptions`` (Google's error model), ``mover`` (how objects are read from
the S3 emulator and written to the GCS emulator), ``server`` (HTTP on loopback, in a thread).
``google-cloud-storage-transfer`` accepts it unchanged over REST.
"""
