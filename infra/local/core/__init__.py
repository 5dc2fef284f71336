"""The core every fake Google API in infra/local is built on, moto-style.

``exceptions`` (Google's error model), ``clock`` (wall or manual time), ``routing`` ((method, path
regex) -> handler), ``backend`` (the lock, injected faults, ordered events, time-driven advance and
paging every state machine needs), ``responses`` (the WSGI app: dispatch, JSON bodies and errors,
the shared ``/_fake/*`` control endpoints), ``server`` (a quiet threaded server on 127.0.0.1 with
an optional ticker). Each fake adds its own ``urls``, ``models`` and ``responses``.
"""
