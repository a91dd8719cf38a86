"""Operations on a deployment: checkpoints and their catalog, restore and replay, payload GC."""
