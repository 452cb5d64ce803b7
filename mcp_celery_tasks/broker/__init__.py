"""Celery and kombu: the Celery app (ours or a team's), broker traffic that is not Celery's own
(inbox queues, the publisher thread) and the profiles where brokers differ."""
