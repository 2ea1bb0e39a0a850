"""Signal receivers that route deletions through ``conversation_delete``.

``Conversation.owner`` is NO ACTION at the database, so deleting a user who
owns conversations would fail on the foreign key (or, worse, orphan them if
the schema said otherwise). Before a user row goes, each of their
conversations leaves through the one door, with the artifact rule and the
blob sweep. The receiver carries no rule of its own.
"""

from __future__ import annotations

from artifacts.gc import artifacts_delete, gc_plan
from artifacts.models import Artifact
from tasks.models import Conversation
from tasks.services import conversation_delete


def user_conversations_delete(sender, instance, using, **kwargs) -> None:
    """Delete every conversation a user owns, then their artifact rows, before
    the user row is deleted."""
    owned = Conversation.objects.using(using).filter(owner_id=instance.pk)
    for pk in list(owned.values_list("pk", flat=True)):
        conversation_delete(conversation_id=pk)
    # The user's own artifact rows that nothing keeps any more (rows are
    # per owner, and only the owner's tasks and turns link them) go by the
    # same rule; blobs go only when no other owner's row names them.
    rest = Artifact.objects.using(using).filter(owner_id=instance.pk)
    plan = gc_plan(candidate_ids=list(rest.values_list("pk", flat=True)), lock=True)
    artifacts_delete(records=plan.remove)
