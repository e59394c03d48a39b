"""Leader-elected sweeper: sweep/shovel loop, leader election with fencing, metrics server.

Modules (each one job):

* `sweeper`  — `Sweeper(store, epoch_source=..., clock=..., threads=64)`: `.sweep_queue(client, queue)`,
  `.sweep_all()` -> `SweepReport`s (DESIGN §4 sweep of main and sideline, fenced pointer advances);
* `shovel`   — `Shovel(store, epoch_source=..., budget=...)`: `.shovel_queue(client, queue, source="sideline"|"dead")`;
* `election` — `LeaderElector` (async) over `StoreLease` or `KubeLease` (coordination.k8s.io/v1);
* `service`  — `SweeperService(store, SweeperSettings(), clock=None).run(stop_event)`: elector + sweep
  loop + shovel loop + probes (`ignis sweeper`); `scaled_clock` for demos with a fast clock;
* `cli`      — `ignis sweep`, `ignis sweeper`, `ignis sideline shovel|redrive`;
* `metrics`, `logs` — Prometheus metrics and JSON-lines logging of the process.
"""
