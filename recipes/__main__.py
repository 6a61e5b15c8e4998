from recipes.cli import main

if __name__ == "__main__":
    main()
