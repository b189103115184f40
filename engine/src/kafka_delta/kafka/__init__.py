"""The pipeline's own Kafka clients: metadata queries (:mod:`.admin`), the settings every
client shares (:mod:`.clients`), and the post-commit hook that copies stored offsets to the
consumer group for lag tools (:mod:`.commit_back`)."""
