"""The task service every protocol revision shares: create, view, wait for, answer and cancel tasks;
the per-process event hub; per-principal quotas."""
