-- A reply the model could not give (its job ended dead, nothing retries it): shown under the message it was
-- for, after a reload too. A reply saved later (the job retried by hand) takes its place.
create table reply_failures (
  message_id integer primary key references messages(id),
  reason text not null,
  at integer not null -- ms since the Unix epoch
);
