"""Fair dispatch: jobs wait in the Postgres backlog and are released to the broker round-robin by
principal. ``release`` is one pass (the API's publisher and the sweeper both run it);
``publisher`` is the API's thread that runs passes."""
