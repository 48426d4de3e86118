-- A user's message may carry the idempotency key its page sent it with (the Idempotency-Key header): a send whose
-- answer was lost and that is sent again with the same key adds no second message (trial EW).
alter table messages add column idempotency_key text;
create unique index message_of_key on messages (chat_id, idempotency_key) where idempotency_key is not null;
