"""Large payloads: reservations, commit proofs, handles, and guarded deletion (retention)."""
