"""The daemon's jobs besides its runtime, one module each (:mod:`hostler.daemon` runs them).

- :mod:`~hostler.daemon_parts.ownership`: the data directory's identity and its owned log.
- :mod:`~hostler.daemon_parts.signals`: SIGTERM and SIGINT as a shutdown, or no signals at all.
- :mod:`~hostler.daemon_parts.device_watch`: the device sampled now and then.
- :mod:`~hostler.daemon_parts.options`: the configured engine options checked (RD6, S8, S9).
- :mod:`~hostler.daemon_parts.startup`: plugins, probe, ledger, replay and reconcile, then the
  take-over of adopted engines and the autostarts.
- :mod:`~hostler.daemon_parts.upkeep`: owed ledger releases settled, log outages recorded.
- :mod:`~hostler.daemon_parts.http_face`: the HTTP face on the runtime.
- :mod:`~hostler.daemon_parts.shutdown`: every engine stopped and the end recorded.
"""
