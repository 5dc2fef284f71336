"""A fake of the Compute Engine v1 REST API for TPU VMs, built like a moto service on the shared core.

``machines`` (TPU machine types), ``capacity`` (chips per zone and provisioning model, reservations,
regional quotas), ``records`` (instances, templates, policies, groups, operations and their JSON),
``models`` (``ComputeBackend``, the state machine, usable without HTTP), made of one mixin a resource
family: ``instances``, ``groups``, ``templates``, ``policies``, ``operations``, ``catalog``
(reservations, regions, zones, projects, machine types), ``hosts`` (simulated guests and spot
preemption), ``placement`` (where a VM may go: capacity and quota), all on ``base`` (state, and the
mechanics every family shares: names, 404/409, requestId, operations, lists, aggregated lists);
``exceptions`` (Compute Engine's error bodies), ``filters`` (the list ``filter`` syntax),
``responses`` (HTTP only), ``urls`` (routing), ``server`` (127.0.0.1, in a thread).
``google-cloud-compute`` drives it unchanged (REST, ``/compute/v1/projects/...``).
"""
