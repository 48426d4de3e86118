-- Chats and their messages. A reply points at the message it answers; one reply per message.
create table chats (
  id integer primary key,
  title text not null,
  created_at integer not null -- ms since the Unix epoch
);

create table messages (
  id integer primary key,
  chat_id integer not null references chats(id),
  role text not null check (role in ('user', 'assistant')),
  text text not null,
  created_at integer not null, -- ms since the Unix epoch
  reply_to integer references messages(id)
);

create index messages_of_chat on messages (chat_id, id);
create unique index one_reply_per_message on messages (reply_to) where reply_to is not null;
