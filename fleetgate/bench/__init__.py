"""`fleetgate bench`: an open-loop load generator for OpenAI-compatible servers.

The modules, in the order a run uses them: `config` (the run's settings) builds a workload from
`traces` (Azure and Mooncake replays, and a user's own file, read by `tracefile`) or
`generated` (shared-prefix, synthetic), timed by `workloads` (specs, arrivals, bounds);
`runner` sends it through fleetgate's HTTP client, reading streams with `fleetgate.http.sse`
and bodies with `payload`; `stats` summarizes the records, `progress` and `report` show them;
`backends` samples a fleetgate gateway's /metrics for the load on each backend while the run
lasts; `page` writes the report for people (`timeline` cuts the run into windows, `plots`
draws them and the backends' samples); `compare` shows saved runs side by side; `command` is
the CLI entry.
"""
