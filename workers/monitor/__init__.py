"""The worker's monitoring: the events it reports and who hears them (``listener``), its live
counters (``live_stats``), and the threads that push them, poll the server and write progress
(``worker_monitor``)."""
