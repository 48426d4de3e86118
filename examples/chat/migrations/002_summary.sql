-- The seed's migration ("One summary per chat at a time"): the summary and the fence of its writer.
alter table chats add column summary text;
alter table chats add column summary_fence text not null default '';
