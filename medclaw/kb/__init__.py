"""Knowledge base: chunk a local corpus, embed it with a local sentence encoder, search it with FAISS."""
