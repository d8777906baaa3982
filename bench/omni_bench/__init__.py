"""omni-bench: a load generator for any OpenAI-compatible server (``bin/omni-bench``).

workload.py builds the seeded conversations, client.py streams one request and times it,
runner.py paces requests (closed loop or Poisson), summary.py is the pure statistics and
report.py prints, saves and plots. Never imports torch: the client shares the machine's
CPUs with the server it measures.
"""
