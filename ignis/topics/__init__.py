"""Topics and subscriptions: publish once, and every subscription whose filter selects the subject gets the message,
each with its own position, acknowledgements, retries and dead letters; a new subscription can replay what the topic
retains. A topic is a sharded, retained log (`TopicSpec`, `Topic`: ignis.topics.topic); a subscription is a queue
fed by a topic (`QueueSpec.subscribe`: ignis.topics.subscribed, ignis.topics.subscriptions), reading it through its
cursor (ignis.magazine.cursor) without a copy of the message.
"""

from ignis.topics.spec import TopicSpec
from ignis.topics.topic import Topic, TopicStats

__all__ = ["Topic", "TopicSpec", "TopicStats"]
