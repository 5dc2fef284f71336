"""A fake of the Compute Engine v1 REST API for TPU VMs, built like a moto service on the shared core.

``machines`` (TPU machine types), ``capacity`` (chips per zone and provisioning model, reservations,
regional quotas), ``records`` (instances, templates, policies, groups, operations and their JSON),
``models`` (the state machine, usable without HTTP), ``exceptions`` (Compute Engine's error
bodies), ``filters`` (the list ``filter`` syntax), ``responses`` (HTTP only), ``urls`` (routing),
``server`` (127.0.0.1, in a thread).
``google-cloud-compute`` drives it unchanged (REST, ``/compute/v1/projects/...``).
"""
