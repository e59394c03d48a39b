"""Leader-elected sweeper: sweep/shovel loop, leader election with fencing, metrics server."""
