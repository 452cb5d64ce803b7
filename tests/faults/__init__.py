"""Fault injection: a deployment of our own whose services and processes the tests stop, kill
and restart, checking that no task handed to a client is lost, completes twice or stays working."""

RUN_DIR_ENV = "FAULTS_RUN_DIR"
"""Where ``tools.f_count`` leaves a mark per run (kept out of ``tools`` so that reading it does
not register the fault tools in the test process)."""
