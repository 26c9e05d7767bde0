"""The console's reads: what its pages show, each a query (or a few) with no write but the
read's own audit row (a person reading run data is audited, R19). A job as a person sees it is
the engine's ``workers.selectors.jobs.job_for_person``; writes are ``console.services`` and the
owning apps' services.
"""
