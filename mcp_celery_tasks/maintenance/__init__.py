"""Beat jobs: collect expired tasks, and sweep jobs that were never published or were lost."""
